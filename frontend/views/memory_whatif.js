// What would make a plan that does not fit fit: the memory view's list of changes to try
// (recompute, more micro-batches, a ZeRO stage or FSDP, more tensor parallelism), each a
// link to the New plan form prefilled with the plan's model, cluster, mesh and templates
// plus that one change (plan_new.js reads them from its URL's query).
import { api } from "../api.js";
import { h } from "../ui.js";

/** "dp=8,tp=2" -> [["dp", 8], ["tp", 2]]. */
function axesOf(mesh) {
  return mesh.split(",").map((t) => t.split("=")).map(([a, n]) => [a.trim(), Number(n)]);
}

const meshText = (axes) => axes.map(([a, n]) => `${a}=${n}`).join(",");

/** The New plan form's URL for `plan` (its strategy `s`) with `change` applied. */
export function newPlanHref(plan, s, change = {}) {
  const o = s.options ?? {};
  const p = o.pipeline ?? {};
  const state = {
    model: plan.model_id, cluster: plan.cluster ?? "", mesh: s.mesh,
    templates: s.templates.join(","), recompute: o.recompute && o.recompute !== "none" ? o.recompute : "",
    schedule: p.schedule, microbatches: p.microbatches, virtual_stages: p.virtual_stages,
    balance: p.balance, annotations: (s.annotations ?? []).join("\n"), ...change,
  };
  const query = new URLSearchParams(Object.entries(state)
    .filter(([, v]) => v !== undefined && v !== null && v !== "").map(([k, v]) => [k, String(v)]));
  return `#/plans/new?${query}`;
}

const ZERO = ["zero1", "zero2", "zero3"];

/** The changes to try: [text, change] pairs. `microbatches`: the pipeline's, if any. */
export function changesFor(s, microbatches = null) {
  const out = [];
  const recompute = s.options?.recompute ?? "none";
  if (recompute === "none") out.push(["selective recomputation (replay attention)", { recompute: "selective" }]);
  if (recompute !== "full") out.push(["full recomputation (keep only each layer's input)", { recompute: "full" }]);
  const axes = axesOf(s.mesh);
  const names = axes.map(([a]) => a);
  if (names.includes("pp")) {
    const m = microbatches ?? axes.find(([a]) => a === "pp")[1];
    out.push([`more micro-batches (${m * 2} instead of ${m})`, { microbatches: m * 2 }]);
  }
  const bare = s.templates.map((t) => t.split(":")[0]);
  if (names.includes("dp") && !bare.includes("fsdp") && !bare.includes("zero3")) {
    const stage = Math.max(0, ...bare.map((t) => ZERO.indexOf(t) + 1));
    const without = s.templates.filter((t) => !ZERO.includes(t.split(":")[0]));
    for (const t of [...ZERO.slice(stage), "fsdp"]) {
      const label = t === "fsdp" ? "FSDP (shard parameters, gradients and optimizer state over dp)"
        : `ZeRO-${t.slice(-1)} over dp`;
      out.push([label, { templates: [...without, t].join(",") }]);
    }
  }
  const dp = axes.find(([a]) => a === "dp");
  const tp = axes.find(([a]) => a === "tp");
  if (dp && dp[1] % 2 === 0) { // more tp on as many devices: half the dp degree
    const more = tp
      ? axes.map(([a, n]) => [a, a === "tp" ? n * 2 : a === "dp" ? n / 2 : n])
      : [...axes.map(([a, n]) => [a, a === "dp" ? n / 2 : n]), ["tp", 2]];
    const templates = bare.includes("megatron_tp") ? s.templates : [...s.templates, "megatron_tp"];
    out.push([`more tensor parallelism (${meshText(more)})`,
      { mesh: meshText(more), templates: templates.join(",") }]);
  }
  return out;
}

/** The card of changes to try for `plan` (null when its strategy cannot be read); `why`
 * says by how much it does not fit. */
export async function whatIf(plan, why, microbatches = null) {
  let s;
  try {
    s = await api(`/api/strategies/${plan.strategy_id}`);
  } catch {
    return null;
  }
  const changes = changesFor(s, microbatches);
  if (!changes.length) return null;
  return h("section", { class: "card", id: "memory-what-if", "aria-labelledby": "memory-what-if-title" },
    h("h2", { id: "memory-what-if-title" }, "What would make it fit"),
    h("p", { class: "status-failed" }, why),
    h("p", { class: "muted" }, "Each opens the New plan form with this plan's model, cluster, "
      + "mesh and templates and that one change; the new plan shows whether it fits."),
    h("ul", {}, changes.map(([text, change]) => h("li", {},
      h("a", { href: newPlanHref(plan, s, change), dataset: { change: Object.keys(change).join(" ") } },
        text)))));
}
