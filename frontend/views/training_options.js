// The New plan form's training options: activation recomputation, the pipeline schedule
// of a mesh with a `pp` axis, and gradient accumulation on a mesh without one. They go into
// the strategy's `options` (see shardlab.strategy).
import { field, labelled } from "../forms.js";
import { h } from "../ui.js";

const RECOMPUTE = [
  ["none", "none — the backward reads what the forward kept"],
  ["selective", "selective — replay the attention core (Korthikanti et al. 2022)"],
  ["full", "full — keep only each layer's input, replay its forward"],
];
const SCHEDULES = [["1f1b", "1F1B"], ["interleaved", "interleaved 1F1B"], ["gpipe", "GPipe"]];
const BALANCES = [["flops", "balanced by FLOPs"], ["time", "balanced by predicted time"],
  ["even", "the same number of layers (Megatron-LM)"]];

function select(choices, value) {
  const el = h("select", {}, choices.map(([v, text]) => h("option", { value: v }, text)));
  el.value = value;
  return el;
}

/** The recompute control: `value()` is the policy ("none" when nothing is replayed). */
export function recomputePicker(initial) {
  const control = select(RECOMPUTE, initial || "none");
  const f = field("recompute", control);
  return {
    field: f,
    element: labelled("Activation recomputation", control, f.line),
    value: () => control.value,
  };
}

/** Schedule, micro-batches, virtual stages (interleaved only) and layer balance, shown
 * while the mesh has a `pp` axis; `value()` is the strategy option `pipeline` (null without
 * a pp axis). */
export function pipelinePicker(query) {
  const schedule = select(SCHEDULES, query.get("schedule") || "1f1b");
  const microbatches = h("input", { type: "number", min: 1, step: 1, style: "width: 6rem",
    value: query.get("microbatches") || "", placeholder: "one per stage" });
  const virtual = h("input", { type: "number", min: 1, step: 1, style: "width: 6rem",
    value: query.get("virtual_stages") || "", placeholder: "2" });
  const virtualLabel = labelled("Virtual stages (layer chunks per pipeline stage)", virtual);
  const balance = select(BALANCES, query.get("balance") || "flops");
  const f = field("pipeline", schedule, microbatches, virtual, balance);
  const box = h("fieldset", { hidden: true }, h("legend", {}, "Pipeline (mesh axis pp)"),
    labelled("Schedule", schedule), labelled("Micro-batches per step", microbatches),
    virtualLabel, labelled("Layers per stage", balance), f.line);
  const showVirtual = () => {
    for (const el of virtualLabel) el.hidden = schedule.value !== "interleaved";
  };
  schedule.addEventListener("change", showVirtual);
  showVirtual();
  let on = false;
  return {
    field: f,
    element: box,
    setAxes(axes) {
      on = axes.includes("pp");
      box.hidden = !on;
    },
    value() {
      if (!on) return null;
      const out = { schedule: schedule.value, balance: balance.value };
      const m = Number.parseInt(microbatches.value, 10);
      if (m > 0) out.microbatches = m;
      const v = Number.parseInt(virtual.value, 10);
      if (schedule.value === "interleaved" && v > 0) out.virtual_stages = v;
      return out;
    },
  };
}

/** Gradient accumulation, shown while the mesh has no `pp` axis: micro-batches run one after
 * another before one optimizer step; `value()` is the strategy option `microbatches` (null:
 * none, or a mesh that pipelines). */
export function accumulationPicker(query) {
  const microbatches = h("input", { type: "number", min: 1, step: 1, style: "width: 6rem",
    value: query.get("accumulate") || "", placeholder: "1" });
  const f = field("microbatches", microbatches);
  const box = h("p", {}, ...labelled("Gradient accumulation steps",
    microbatches, h("span", { class: "muted" },
      " the local batch cut into this many, run one after another, one optimizer step"),
    f.line));
  let on = true;
  return {
    field: f,
    element: box,
    setAxes(axes) {
      on = !axes.includes("pp");
      box.hidden = !on;
    },
    value() {
      const m = Number.parseInt(microbatches.value, 10);
      return on && m > 1 ? m : null;
    },
  };
}
