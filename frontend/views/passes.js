// Passes view (#/plans/:id/passes?a=&b=): the program after lowering and after each pass
// with its simulated step, and one stage against another ("before and after a pass"): step
// time, MFU, memory, collectives side by side, and which layers got faster or slower.
import { api } from "../api.js";
import { errorBox, fmtBytes, fmtInt, fmtPercent, fmtTime, h, planTabs, plotly } from "../ui.js";
import { costedPlan } from "./timeline.js";

const FASTER = "#2e7d32";
const SLOWER = "#b3261e";

/** A signed delta coloured by its sign: better/worse (lower is better unless
 * `higherIsBetter`); zero, or a delta too small to show ("0.0 µs"), is neutral. */
export function delta(value, fmt, higherIsBetter = false) {
  if (value === null || value === undefined || !Number.isFinite(value)) return h("span", {}, "–");
  const shown = fmt(Math.abs(value));
  const digits = shown.match(/^[\d.,]+/)?.[0];
  if (value === 0 || (digits !== undefined && !/[1-9]/.test(digits))) {
    return h("span", { class: "delta-neutral muted" }, "±0");
  }
  const better = higherIsBetter ? value > 0 : value < 0;
  return h("span", { class: better ? "delta-better" : "delta-worse" },
    `${value > 0 ? "+" : "−"}${shown}`);
}

function stagesTable(stages) {
  return h("table", { id: "stages-table", "aria-label": "pass stages" },
    h("thead", {}, h("tr", {},
      h("th", { class: "num" }, "#"), h("th", {}, "Pass"), h("th", {}, "What it did"),
      h("th", { class: "num" }, "Ops"), h("th", { class: "num" }, "Step time"),
      h("th", { class: "num" }, "Δ vs previous"), h("th", { class: "num" }, "Exposed comm"),
      h("th", { class: "num" }, "MFU"), h("th", { class: "num" }, "Peak memory"))),
    h("tbody", {}, stages.map((s, i) => h("tr",
      { dataset: { stage: s.name, declined: String(Boolean(s.declined)) } },
      h("td", { class: "num" }, String(i)),
      h("td", {}, h("code", {}, s.name)),
      h("td", {}, s.declined
        ? h("span", { class: "delta-worse", title: s.declined_reason }, s.message) : s.message),
      h("td", { class: "num" }, fmtInt(s.ops)),
      h("td", { class: "num" }, fmtTime(s.step_time_s)),
      h("td", { class: "num" }, i === 0 ? h("span", { class: "muted" }, "–")
        : delta(s.step_time_s - stages[i - 1].step_time_s, fmtTime)),
      h("td", { class: "num" }, fmtTime(s.exposed_comm_s)),
      h("td", { class: "num" }, fmtPercent(s.mfu)),
      h("td", { class: "num" }, fmtBytes(s.peak_memory_bytes))))));
}

function sideBySide(cmp) {
  const rows = [
    ["Step time", "step_time_s", fmtTime, false],
    ["MFU", "mfu", fmtPercent, true],
    ["Tokens / s", "tokens_per_s", (v) => fmtInt(Math.round(v)), true],
    ["Compute", "compute_s", fmtTime, false],
    ["Comm (busy)", "comm_s", fmtTime, false],
    ["Exposed comm", "exposed_comm_s", fmtTime, false],
    ["Peak memory", "peak_memory_bytes", fmtBytes, false],
    ["Ops", "ops", fmtInt, false],
  ];
  return h("table", { id: "compare-figures", "aria-label": "figures before and after" },
    h("thead", {}, h("tr", {}, h("th", {}, ""), h("th", { class: "num" }, `Before: ${cmp.a.stage}`),
      h("th", { class: "num" }, `After: ${cmp.b.stage}`), h("th", { class: "num" }, "Δ (after − before)"))),
    h("tbody", {}, rows.map(([label, key, fmt, higher]) => h("tr", {},
      h("th", {}, label),
      h("td", { class: "num" }, fmt(cmp.a[key])),
      h("td", { class: "num" }, fmt(cmp.b[key])),
      h("td", { class: "num" }, delta(cmp.b[key] - cmp.a[key], fmt, higher))))));
}

function collectivesTable(cmp) {
  if (!cmp.collectives.length) return h("p", { class: "muted" }, "No collectives in either stage.");
  return h("table", { id: "compare-collectives", "aria-label": "collectives before and after" },
    h("thead", {}, h("tr", {}, h("th", {}, "Collective"),
      h("th", { class: "num" }, "Count before"), h("th", { class: "num" }, "Count after"),
      h("th", { class: "num" }, "Bytes / rank before"), h("th", { class: "num" }, "Bytes / rank after"),
      h("th", { class: "num" }, "Δ count"))),
    h("tbody", {}, cmp.collectives.map((c) => h("tr", {},
      h("td", {}, h("code", {}, c.kind)),
      h("td", { class: "num" }, fmtInt(c.a.count)), h("td", { class: "num" }, fmtInt(c.b.count)),
      h("td", { class: "num" }, fmtBytes(c.a.bytes_per_rank)),
      h("td", { class: "num" }, fmtBytes(c.b.bytes_per_rank)),
      h("td", { class: "num" }, delta(c.delta_count, fmtInt))))));
}

/** Horizontal bars of each layer scope's delta (compute + exposed comm), ms; green faster. */
export function scopeFigure(cmp) {
  const scopes = cmp.scopes;
  const label = (s) => s.scope || "(no scope)";
  return {
    traces: [{
      type: "bar",
      orientation: "h",
      name: "Δ time",
      y: scopes.map(label),
      x: scopes.map((s) => s.delta * 1e3),
      marker: { color: scopes.map((s) => (s.delta < 0 ? FASTER : s.delta > 0 ? SLOWER : "#999")) },
      hovertext: scopes.map((s) => [
        `<b>${label(s)}</b>: ${s.delta < 0 ? "faster" : s.delta > 0 ? "slower" : "unchanged"} by ${fmtTime(Math.abs(s.delta))}`,
        `compute ${fmtTime(s.a.compute)} → ${fmtTime(s.b.compute)}`,
        `exposed comm ${fmtTime(s.a.exposed_comm)} → ${fmtTime(s.b.exposed_comm)}`,
        `comm busy ${fmtTime(s.a.comm)} → ${fmtTime(s.b.comm)}`,
      ].join("<br>")),
      hoverinfo: "text",
    }],
    layout: {
      height: Math.max(220, 60 + 24 * scopes.length),
      margin: { l: 140, r: 20, t: 10, b: 50 },
      xaxis: { title: { text: "Δ compute + exposed comm (ms); negative = faster" }, zeroline: true },
      yaxis: { type: "category", autorange: "reversed", automargin: true },
      showlegend: false,
    },
  };
}

export async function render(root, ctx) {
  const id = ctx.params.id;
  const state = { a: ctx.query.get("a") || null, b: ctx.query.get("b") || null };
  const query = () => new URLSearchParams(Object.entries(state).filter(([, v]) => v)).toString();
  const tabs = h("div", {}, planTabs(id, "passes", query()));
  const body = h("div", {}, h("p", { class: "loading" }, "loading…"));
  root.append(tabs, h("h1", {}, `Plan ${id} · passes`), body);

  let stages;
  try {
    if (!(await costedPlan(id, body))) return;
    stages = await api(`/api/plans/${id}/stages`);
  } catch (err) {
    body.replaceChildren(errorBox(err));
    return;
  }
  if (ctx.signal.aborted) return;
  const names = stages.map((s) => s.name);
  if (!names.includes(state.a)) state.a = null;
  if (!names.includes(state.b)) state.b = null;
  const Plotly = await plotly();

  const pick = (id_, label, chosen) => h("div", {},
    h("label", { for: id_ }, label),
    h("select", { id: id_ }, names.map((n) => h("option", { value: n, selected: n === chosen }, n))));
  const before = pick("passes-a", "Before", state.a ?? names[0]);
  const after = pick("passes-b", "After", state.b ?? names[names.length - 1]);
  const result = h("div", {});
  const plot = h("div", { id: "scope-deltas", role: "img",
    "aria-label": "per-layer change in time, negative is faster" });
  body.replaceChildren(
    h("section", { class: "card" }, h("h2", {}, "The program after each pass"),
      h("p", { class: "muted" }, "Step time as simulated on the plan's cluster; Δ against the stage above. "
        + "A pass that would make the step slower is declined: its stage keeps the program above."),
      stagesTable(stages)),
    h("section", { class: "card" },
      h("h2", {}, "Before and after"),
      h("div", { style: "display:flex;gap:1.5rem;flex-wrap:wrap" }, before, after),
      result,
      h("h3", {}, "Per layer: which got faster (green) or slower (red)"),
      plot));

  let seq = 0;
  const compare = async () => {
    const mine = ++seq;
    const a = before.querySelector("select").value;
    const b = after.querySelector("select").value;
    try {
      const cmp = await api(`/api/plans/${id}/stages/compare?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`);
      if (mine !== seq || ctx.signal.aborted) return;
      result.replaceChildren(
        h("p", { class: "muted" }, `rank ${cmp.rank}'s simulated step; deltas are after − before.`),
        sideBySide(cmp), h("h3", {}, "Collectives"), collectivesTable(cmp));
      const fig = scopeFigure(cmp);
      await Plotly.react(plot, fig.traces, fig.layout, { responsive: true, displaylogo: false });
    } catch (err) {
      if (!ctx.signal.aborted) result.replaceChildren(errorBox(err));
    }
  };
  const changed = () => {
    state.a = before.querySelector("select").value;
    state.b = after.querySelector("select").value;
    ctx.setQuery({ a: state.a, b: state.b });
    tabs.replaceChildren(planTabs(id, "passes", query()));
    compare();
  };
  before.querySelector("select").addEventListener("change", changed);
  after.querySelector("select").addEventListener("change", changed);
  ctx.signal.addEventListener("abort", () => Plotly.purge(plot));
  await compare();
}
