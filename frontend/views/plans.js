// The team's plans: what was planned, its state, and the headline cost figures, a page of
// `PAGE` plans at a time (newest first).
import { api, apiPage } from "../api.js";
import { fmtBytes, fmtPercent, fmtTime, h } from "../ui.js";

/** Plans per page. */
export const PAGE = 50;

/** Name lookups for the plans table: model id -> name, strategy id -> "name v<version>". */
async function names() {
  const [models, strategies] = await Promise.all([api("/api/models?limit=1000"),
    api("/api/strategies?all_versions=true&limit=1000")]);
  return {
    model: new Map(models.map((m) => [m.id, m.name])),
    strategy: new Map(strategies.map((s) => [s.id, `${s.name} v${s.version}`])),
  };
}

function statusCell(plan) {
  const text = plan.status === "running" ? `running ${fmtPercent(plan.progress)}` : plan.status;
  return h("td", { class: `status-${plan.status}` }, text);
}

function row(plan, lookup) {
  const cost = plan.summary?.cost;
  return h("tr", { dataset: { planId: plan.id } },
    h("td", {}, h("a", { href: `#/plans/${plan.id}` }, `#${plan.id}`)),
    h("td", {}, lookup.model.get(plan.model_id) ?? plan.model_id),
    h("td", {}, lookup.strategy.get(plan.strategy_id) ?? plan.strategy_id),
    h("td", {}, plan.summary?.mesh ?? ""),
    h("td", {}, plan.cluster ?? "–"),
    statusCell(plan),
    h("td", { class: "num" }, cost ? fmtTime(cost.step_time_s) : "–"),
    h("td", { class: "num" }, cost ? fmtPercent(cost.mfu) : "–"),
    h("td", { class: "num" }, cost ? fmtBytes(cost.peak_memory_bytes) : "–"));
}

/** "Plans 51–100 of 130" with the buttons to the pages either side. */
function pager(offset, count, total, show) {
  const button = (label, to, enabled) => h("button", { type: "button", class: "secondary",
    disabled: !enabled, onclick: () => show(to) }, label);
  return h("nav", { class: "pager", "aria-label": "plan pages" },
    button("Newer", Math.max(0, offset - PAGE), offset > 0),
    h("span", { id: "plans-range" }, `Plans ${offset + 1}–${offset + count} of ${total}`),
    button("Older", offset + PAGE, offset + count < total));
}

export async function render(root, ctx) {
  const offset = Math.max(0, Number(ctx.query.get("offset")) || 0);
  const [page, lookup] = await Promise.all([apiPage(`/api/plans?limit=${PAGE}&offset=${offset}`),
    names()]);
  const plans = page.items;
  root.append(
    h("h1", {}, "Plans"),
    h("p", {}, h("a", { href: "#/plans/new" }, "New plan"), " · ",
      h("a", { href: "#/compare" }, "Compare two plans")));
  if (!plans.length && offset === 0) {
    root.append(h("p", { class: "muted" }, "No plans yet."));
    return;
  }
  const show = (to) => { window.location.hash = to ? `#/plans?offset=${to}` : "#/plans"; };
  const head = ["Plan", "Model", "Strategy", "Mesh", "Cluster", "Status", "Step time", "MFU",
    "Peak memory / rank"];
  root.append(h("table", { "aria-label": "plans" },
    h("thead", {}, h("tr", {}, head.map((t, i) => h("th", { class: i > 5 ? "num" : null }, t)))),
    h("tbody", {}, plans.map((p) => row(p, lookup)))),
  pager(offset, plans.length, page.total, show));
  // keep unfinished plans fresh while the page is open
  if (plans.some((p) => ["queued", "running"].includes(p.status)) && !ctx.signal.aborted) {
    const timer = setTimeout(() => window.dispatchEvent(new HashChangeEvent("hashchange")), 2000);
    ctx.signal.addEventListener("abort", () => clearTimeout(timer));
  }
}
