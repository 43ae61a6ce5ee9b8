// The team's plans: what was planned, its state, and the headline cost figures.
import { api } from "../api.js";
import { fmtBytes, fmtPercent, fmtTime, h } from "../ui.js";

/** Name lookups for the plans table: model id -> name, strategy id -> "name v<version>". */
async function names() {
  const [models, strategies] = await Promise.all([api("/api/models"), api("/api/strategies")]);
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

export async function render(root, ctx) {
  const [plans, lookup] = await Promise.all([api("/api/plans"), names()]);
  root.append(
    h("h1", {}, "Plans"),
    h("p", {}, h("a", { href: "#/plans/new" }, "New plan"), " · ",
      h("a", { href: "#/compare" }, "Compare two plans")));
  if (!plans.length) {
    root.append(h("p", { class: "muted" }, "No plans yet."));
    return;
  }
  const head = ["Plan", "Model", "Strategy", "Mesh", "Cluster", "Status", "Step time", "MFU",
    "Peak memory / rank"];
  root.append(h("table", { "aria-label": "plans" },
    h("thead", {}, h("tr", {}, head.map((t, i) => h("th", { class: i > 5 ? "num" : null }, t)))),
    h("tbody", {}, plans.map((p) => row(p, lookup)))));
  // keep unfinished plans fresh while the page is open
  if (plans.some((p) => ["queued", "running"].includes(p.status)) && !ctx.signal.aborted) {
    const timer = setTimeout(() => window.dispatchEvent(new HashChangeEvent("hashchange")), 2000);
    ctx.signal.addEventListener("abort", () => clearTimeout(timer));
  }
}
