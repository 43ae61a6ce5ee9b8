// The memory view of a pipelined plan: per stage, what one of its ranks holds at the worst
// moment of the schedule (model states of its layers, the activations of the micro-batches
// in flight, one unit's temporaries) as a stacked bar against the device's capacity.
// The figures come from the plan's summary (`pipeline.stages[].memory`).
import { binaryTicks, CATEGORY_COLORS, fmtBytes, h, plotly } from "../ui.js";
import { whatIf } from "./memory_whatif.js";

const PARTS = [
  ["parameters", (m) => m.model_state_bytes.parameters || 0],
  ["gradients", (m) => m.model_state_bytes.gradients || 0],
  ["optimizer state", (m) => m.model_state_bytes.optimizer_state || 0],
  ["activations", (m) => m.activations_bytes],
  ["buffers", (m) => m.temporaries_bytes],
];

/** Render pipeline `p` (a plan summary's `pipeline`) of `plan` into `body`. */
export async function renderStageMemory(body, p, ctx, plan) {
  const Plotly = await plotly();
  if (ctx.signal.aborted) return;
  const stages = p.stages.filter((s) => s.memory);
  const x = stages.map((s) => `stage ${s.stage}`);
  const traces = PARTS.map(([label, pick]) => ({
    type: "bar",
    name: label === "buffers" ? "temporaries" : label,
    x,
    y: stages.map((s) => pick(s.memory)),
    marker: { color: CATEGORY_COLORS[label] },
    hovertext: stages.map((s) => `${label}: ${fmtBytes(pick(s.memory))}`
      + (label === "activations" ? `<br>micro-batches in flight: ${s.memory.in_flight.join(" + ")}` : "")),
    hoverinfo: "text",
  }));
  const capacity = p.memory_capacity_bytes;
  const peak = Math.max(...stages.map((s) => s.memory.peak_bytes));
  const plot = h("div", { id: "stage-memory-plot", role: "img",
    "aria-label": `memory per pipeline stage: peak ${fmtBytes(peak)} of ${fmtBytes(capacity)}` });
  const over = stages.filter((s) => !s.memory.fits).map((s) => s.stage);
  const verdict = over.length
    ? h("p", { class: "fits status-failed" }, `Stages ${over.join(", ")} do not fit `
      + `${fmtBytes(capacity)}: the worst needs ${fmtBytes(peak)}.`)
    : h("p", { class: "fits status-succeeded" }, `Every stage fits: the worst needs `
      + `${fmtBytes(peak)} of ${fmtBytes(capacity)}.`);
  const fixes = over.length ? await whatIf(plan, `The worst stage needs ${fmtBytes(peak)} of `
    + `${fmtBytes(capacity)}: it does not fit.`, p.microbatches) : null;
  if (ctx.signal.aborted) return;
  body.replaceChildren(verdict, ...(fixes ? [fixes] : []), h("p", { class: "muted" },
    "Per stage, one rank at the worst moment of the schedule: its layers' model states, the "
    + "activations each micro-batch in flight keeps for its backward (1F1B holds p - s on "
    + "stage s), and one unit's temporaries. Bytes in GiB (binary units)."), plot);
  // up to the capacity when the stages come near it; else to the peak (a small model's
  // bars would not show), the capacity named above the scale
  const near = peak >= capacity / 5;
  const top = near ? Math.max(peak, capacity) * 1.08 : peak * 1.15;
  const ticks = binaryTicks(top);
  await Plotly.react(plot, traces, {
    barmode: "stack",
    height: 380,
    margin: { l: 80, r: 20, t: 30, b: 40 },
    yaxis: { title: { text: `bytes per rank (${ticks.title})` }, range: [0, top],
      tickvals: ticks.tickvals, ticktext: ticks.ticktext },
    legend: { orientation: "h", y: 1.12, x: 0 },
    shapes: near ? [{ type: "line", xref: "paper", x0: 0, x1: 1, yref: "y", y0: capacity,
      y1: capacity, line: { color: "#b3261e", width: 2, dash: "dash" } }] : [],
    annotations: [{ xref: "paper", x: 1, xanchor: "right", yref: near ? "y" : "paper",
      y: near ? capacity : 1, yanchor: "bottom", showarrow: false, font: { color: "#b3261e" },
      text: `capacity ${fmtBytes(capacity)}${near ? "" : " (above this scale)"}` }],
  }, { responsive: true, displaylogo: false });
  ctx.signal.addEventListener("abort", () => Plotly.purge(plot));
}
