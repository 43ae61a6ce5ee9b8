// A pipelined plan's stages on the plan overview: the schedule's step, its bubble against
// the textbook (p-1)/(vm+p-1), and per stage its layers, unit times and memory (model
// states, activations of the micro-batches in flight, temporaries) against the capacity.
import { fmtBytes, fmtPercent, fmtTime, h } from "../ui.js";

function layers(list) {
  return list.length ? `${list[0]}–${list[list.length - 1]}` : "–";
}

/** The `pipeline` part of a plan's summary, as a section. */
export function pipelineSection(p) {
  if (p.accumulation) return accumulationSection(p);
  const head = h("p", {}, `${p.schedule} schedule, ${p.pp} stages, ${p.microbatches} micro-batches`
    + (p.virtual_stages > 1 ? `, ${p.virtual_stages} model chunks per stage` : "")
    + `, layers ${{ even: "evenly split", time: "balanced by predicted time" }[p.balance]
      || "balanced by FLOPs"}.`);
  const out = [h("h2", {}, "Pipeline"), head];
  if (p.step_time_s !== undefined) {
    out.push(h("p", {}, `Step ${fmtTime(p.step_time_s)} on ${p.cluster}; bubble `
      + `${fmtPercent(p.bubble_fraction)} (textbook (p-1)/(vm+p-1): ${fmtPercent(p.bubble_formula)}); `
      + `MFU ${fmtPercent(p.mfu)}, HFU ${fmtPercent(p.hfu)}.`));
  }
  const costed = p.stages.some((s) => s.memory);
  const cols = ["Stage", "Layers", ...(costed ? ["Forward / µ-batch", "Backward / µ-batch", "Optimizer and gradient sync",
    "Model states", "Activations (in flight)", "Temporaries", "Peak memory"] : [])];
  out.push(h("table", { "aria-label": "pipeline stages" },
    h("thead", {}, h("tr", {}, cols.map((c, i) => h("th", i > 1 ? { class: "num" } : {}, c)))),
    h("tbody", {}, p.stages.map((s) => {
      const cells = [h("td", {}, String(s.stage)), h("td", {}, layers(s.layers))];
      if (s.memory) {
        const m = s.memory;
        const states = Object.values(m.model_state_bytes).reduce((a, b) => a + b, 0);
        const sum = (xs) => xs.reduce((a, b) => a + b, 0);
        cells.push(
          h("td", { class: "num" }, fmtTime(sum(s.forward_s))),
          h("td", { class: "num" }, fmtTime(sum(s.backward_s))),
          h("td", { class: "num" }, fmtTime(s.tail_s)),
          h("td", { class: "num" }, fmtBytes(states)),
          h("td", { class: "num" }, `${fmtBytes(m.activations_bytes)} (${m.in_flight.join("+")})`),
          h("td", { class: "num" }, fmtBytes(m.temporaries_bytes)),
          h("td", { class: `num ${m.fits ? "" : "status-failed"}` },
            `${fmtBytes(m.peak_bytes)}${m.fits ? "" : " — does NOT fit"}`));
      }
      return h("tr", {}, cells);
    }))));
  return h("section", { "aria-label": "pipeline" }, out);
}

/** Gradient accumulation (a plan without a `pp` axis whose step runs several micro-batches,
 * costed as a schedule of one stage): per micro-batch times, what follows the last one, and
 * the memory of one micro-batch in flight. */
function accumulationSection(p) {
  const out = [h("h2", {}, "Gradient accumulation"),
    h("p", {}, `${p.microbatches} micro-batches one after another, then one optimizer step; the `
      + "gradient reductions overlap the backward they follow.")];
  const [s] = p.stages;
  if (p.step_time_s !== undefined && s.memory) {
    const m = s.memory;
    const states = Object.values(m.model_state_bytes).reduce((a, b) => a + b, 0);
    out.push(h("p", {}, `Step ${fmtTime(p.step_time_s)} on ${p.cluster}: `
      + `${p.microbatches} × (forward ${fmtTime(s.forward_s[0])} + backward ${fmtTime(s.backward_s[0])}) `
      + `+ ${fmtTime(s.tail_s)} of gradient reductions the backwards did not hide (every `
      + "micro-batch's under FSDP and ZeRO-2/3, else the last's) and the optimizer; "
      + `MFU ${fmtPercent(p.mfu)}, HFU ${fmtPercent(p.hfu)}.`));
    out.push(h("p", { class: m.fits ? "" : "status-failed" }, `Memory per rank: peak `
      + `${fmtBytes(m.peak_bytes)} = model states ${fmtBytes(states)} + activations `
      + `${fmtBytes(m.activations_bytes)} (one micro-batch) + temporaries ${fmtBytes(m.temporaries_bytes)}`
      + (m.fits ? "." : ": it does not fit.")));
  }
  return h("section", { "aria-label": "gradient accumulation" }, out);
}
