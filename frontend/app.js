// The single-page shell: a hash router whose URLs are permalinks (`#/plans/3/graph?scope=x`).
//
// Each view is an ES module exporting `render(root, ctx)`, where `ctx` has
//   params   - the route's path parameters ({id: "3"})
//   query    - URLSearchParams of the hash's query (scope, value, rank, stage, t0, t1, ...)
//   setQuery - (updates) => void: record view state in the URL without re-rendering
//   signal   - an AbortSignal aborted when the user leaves the view
// and returns nothing (or a Promise). Views load everything from the REST API.
// Under every view of one plan (`#/plans/3`, `#/plans/3/graph`, ...) the shell adds the
// plan's review panel (views/review.js).
import { api, ApiError } from "./api.js";
import { errorBox, h } from "./ui.js";

const ROUTES = [
  [/^\/models$/, "./views/models.js"],
  [/^\/plans$/, "./views/plans.js"],
  [/^\/plans\/new$/, "./views/plan_new.js"],
  [/^\/plans\/(?<id>\d+)$/, "./views/plan.js"],
  [/^\/plans\/(?<id>\d+)\/graph$/, "./views/graph.js"],
  [/^\/plans\/(?<id>\d+)\/sharding$/, "./views/sharding.js"],
  [/^\/plans\/(?<id>\d+)\/timeline$/, "./views/timeline.js"],
  [/^\/plans\/(?<id>\d+)\/memory$/, "./views/memory.js"],
  [/^\/plans\/(?<id>\d+)\/passes$/, "./views/passes.js"],
  [/^\/compare$/, "./views/compare.js"],
  [/^\/search$/, "./views/search.js"],
];

const root = document.getElementById("view");
let current = null; // {controller, path}
let me = null; // /api/me once signed in

function parseHash() {
  const hash = location.hash.replace(/^#/, "") || "/plans";
  const [path, search = ""] = hash.split("?");
  return { path, query: new URLSearchParams(search) };
}

function setQuery(path, updates) {
  const { query } = parseHash();
  for (const [key, value] of Object.entries(updates)) {
    if (value === null || value === undefined || value === "") query.delete(key);
    else query.set(key, String(value));
  }
  const search = query.toString();
  history.replaceState(null, "", `#${path}${search ? `?${search}` : ""}`);
}

async function showUser() {
  const el = document.getElementById("whoami");
  try {
    me = await api("/api/me");
    el.textContent = `${me.user ?? "token"} · team ${me.team}`;
    return true;
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      el.textContent = "not signed in";
      root.replaceChildren(h("section", { class: "card" },
        h("h1", {}, "Sign in"),
        h("p", {}, "Open the one-time login link that ", h("code", {}, "shardlab serve"),
          " printed (or ask an admin for one), then come back to this page.")));
      return false;
    }
    throw err;
  }
}

/** The tab's title, one form for every view: "Plan 3 · graph · Shardlab" under a plan,
 * else "<the page's heading> · Shardlab". */
function titleOf(path, page) {
  const plan = path.match(/^\/plans\/(\d+)(?:\/(\w+))?$/);
  if (plan) return `Plan ${plan[1]} · ${plan[2] ?? "overview"} · Shardlab`;
  const heading = page?.querySelector("h1")?.textContent.trim();
  return heading ? `${heading} · Shardlab` : "Shardlab";
}

async function route() {
  const { path, query } = parseHash();
  const match = ROUTES.map(([re, mod]) => [path.match(re), mod]).find(([m]) => m);
  current?.controller.abort();
  const controller = new AbortController();
  current = { controller, path };
  for (const link of document.querySelectorAll("header nav a")) {
    const target = link.getAttribute("href").slice(1);
    link.toggleAttribute("aria-current", target === path);
  }
  if (!match) {
    root.replaceChildren(errorBox(new Error(`no such page: ${path}`)));
    return;
  }
  const [m, modulePath] = match;
  root.replaceChildren(h("p", { class: "loading" }, "loading…"));
  try {
    const view = await import(modulePath);
    if (controller.signal.aborted) return;
    const ctx = {
      params: { ...(m.groups ?? {}) },
      query,
      setQuery: (updates) => setQuery(path, updates),
      signal: controller.signal,
    };
    const page = document.createElement("div");
    page.className = "page";
    root.replaceChildren(page);
    const planId = path.match(/^\/plans\/(\d+)(\/|$)/)?.[1];
    if (planId) {
      const { reviewPanel } = await import("./views/review.js");
      root.append(reviewPanel(Number(planId), me, controller.signal));
    }
    document.title = titleOf(path, null);
    await view.render(page, ctx);
    if (!controller.signal.aborted) document.title = titleOf(path, page);
  } catch (err) {
    if (!controller.signal.aborted) {
      console.warn(err);
      root.replaceChildren(errorBox(err));
    }
  }
}

window.addEventListener("hashchange", route);
showUser().then((ok) => { if (ok) route(); }).catch((err) => root.replaceChildren(errorBox(err)));
