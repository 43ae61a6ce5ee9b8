// The team's plans: what was planned, its state, its review state and the headline cost
// figures, a page of `PAGE` plans at a time (newest first). `?show=waiting` lists the plans
// waiting for my review, `?show=mine` my plans (the filter and page live in the URL).
import { api, apiPage } from "../api.js";
import { fmtBytes, fmtPercent, fmtTime, h, pager } from "../ui.js";
import { reviewBadge } from "./review.js";

/** The lists the tabs offer: URL value -> [label, API filter]. */
const SHOWS = {
  all: ["All plans", ""],
  waiting: ["Waiting for my review", "&reviewer=me"],
  mine: ["My plans", "&author=me"],
};

/** Plans per page. */
export const PAGE = 50;

function statusCell(plan) {
  const text = plan.status === "running" ? `running ${fmtPercent(plan.progress)}` : plan.status;
  return h("td", { class: `status-${plan.status}` }, text);
}

function row(plan) {
  const cost = plan.summary?.cost;
  return h("tr", { dataset: { planId: plan.id } },
    h("td", {}, h("a", { href: `#/plans/${plan.id}` }, `#${plan.id}`)),
    h("td", {}, plan.model ?? plan.model_id),
    h("td", {}, plan.strategy ?? plan.strategy_id),
    h("td", {}, plan.summary?.mesh ?? ""),
    h("td", {}, plan.cluster ?? "–"),
    statusCell(plan),
    h("td", {}, reviewBadge(plan.review_state), plan.author ? ` ${plan.author}` : ""),
    h("td", { class: "num" }, cost ? fmtTime(cost.step_time_s) : "–"),
    h("td", { class: "num" }, cost ? fmtPercent(cost.mfu) : "–"),
    h("td", { class: "num" }, cost ? fmtBytes(cost.peak_memory_bytes) : "–"));
}

/** The tabs above the list; a signed-in user (not a team token) sees their own lists. */
function showTabs(show, me, waiting) {
  return h("nav", { class: "tabs", "aria-label": "plan lists" },
    Object.entries(SHOWS).filter(([key]) => key === "all" || me.user).map(([key, [label]]) =>
      h("a", { href: key === "all" ? "#/plans" : `#/plans?show=${key}`,
        "aria-current": key === show ? "page" : null },
      key === "waiting" && waiting !== null ? `${label} (${waiting})` : label)));
}

export async function render(root, ctx) {
  const offset = Math.max(0, Number(ctx.query.get("offset")) || 0);
  const me = await api("/api/me");
  const show = me.user && SHOWS[ctx.query.get("show")] ? ctx.query.get("show") : "all";
  const [page, waiting] = await Promise.all([
    apiPage(`/api/plans?limit=${PAGE}&offset=${offset}${SHOWS[show][1]}`),
    me.user ? apiPage("/api/plans?limit=1&reviewer=me").then((p) => p.total) : null]);
  const plans = page.items;
  root.append(
    h("h1", {}, "Plans"),
    h("p", {}, h("a", { href: "#/plans/new" }, "New plan"), " · ",
      h("a", { href: "#/compare" }, "Compare two plans")),
    showTabs(show, me, waiting));
  if (!plans.length && offset === 0) {
    root.append(h("p", { class: "muted" }, show === "waiting"
      ? "Nothing is waiting for your review." : "No plans yet."));
    return;
  }
  const base = show === "all" ? "#/plans" : `#/plans?show=${show}`;
  const go = (to) => {
    window.location.hash = to ? `${base}${base.includes("?") ? "&" : "?"}offset=${to}` : base;
  };
  const head = ["Plan", "Model", "Strategy", "Mesh", "Cluster", "Status", "Review", "Step time",
    "MFU", "Peak memory / rank"];
  root.append(h("table", { "aria-label": "plans" },
    h("thead", {}, h("tr", {}, head.map((t, i) => h("th", { class: i > 6 ? "num" : null }, t)))),
    h("tbody", {}, plans.map((p) => row(p)))),
  pager({ noun: "Plans", label: "plan pages", offset, count: plans.length, total: page.total, size: PAGE, go,
    id: "plans-range" }));
  // keep unfinished plans fresh while the page is open
  if (plans.some((p) => ["queued", "running"].includes(p.status)) && !ctx.signal.aborted) {
    const timer = setTimeout(() => window.dispatchEvent(new HashChangeEvent("hashchange")), 2000);
    ctx.signal.addEventListener("abort", () => clearTimeout(timer));
  }
}
