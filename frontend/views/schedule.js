// The timeline of a pipelined plan (#/plans/:id/timeline?t0=&t1=&slot=): its schedule.
// One row per stage, one bar per slot (a model chunk's forward or backward over one
// micro-batch), then the stage's optimizer tail; drawn on a canvas, so 512 micro-batches on
// 64 stages draw as fast as 4 on 2. Drag across the chart to zoom (the window goes to the
// URL as t0, t1 in seconds); click a slot to list the ops of its unit with their times.
import { api } from "../api.js";
import {
  errorBox, fmtBytes, fmtInt, fmtPercent, fmtTime, h, ranksText, ROLE_COLORS,
} from "../ui.js";

const ROW = 22;
const GAP = 4;
const LABEL = 150;
const AXIS = 24;
const RIGHT = 8; // margin right of the time axis
const PHASES = { F: ["forward", ROLE_COLORS.forward], B: ["backward", ROLE_COLORS.backward] };

function headline(view) {
  const slots = view.stages.reduce((n, st) => n + st.slots.phase.length, 0);
  return h("p", { id: "schedule-headline" },
    `${view.schedule} schedule: ${view.pp} stages × ${view.microbatches} micro-batches`
    + (view.virtual_stages > 1 ? ` × ${view.virtual_stages} model chunks per stage` : "")
    + ` = ${fmtInt(slots)} slots, from ${view.units.length} distinct units costed once. `
    + `Step ${fmtTime(view.step_time_s)}; bubble ${fmtPercent(view.bubble_fraction)} `
    + `(textbook (p-1)/(vm+p-1): ${fmtPercent(view.bubble_formula)}).`);
}

/** The canvas's drawing width in CSS pixels (900 before it is laid out). */
function canvasWidth(canvas) {
  return canvas.clientWidth || 900;
}

/** Draw the stages' slots in [t0, t1] on `canvas`; returns the hit test (x, y) -> slot. */
function paint(canvas, view, t0, t1, selected) {
  const width = canvasWidth(canvas);
  const height = AXIS + view.stages.length * (ROW + GAP);
  const ratio = window.devicePixelRatio || 1;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  canvas.style.height = `${height}px`;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, width, height);
  const plotW = width - LABEL - RIGHT;
  const x = (t) => LABEL + ((t - t0) / (t1 - t0)) * plotW;
  g.font = "12px system-ui, sans-serif";
  g.fillStyle = "#444";
  g.textBaseline = "middle";
  for (let k = 0; k <= 5; k += 1) { // time axis
    const t = t0 + ((t1 - t0) * k) / 5;
    g.fillText(fmtTime(t), Math.min(x(t), width - 60), AXIS / 2);
    g.fillRect(x(t), AXIS - 4, 1, 4);
  }
  view.stages.forEach((st, row) => {
    const y = AXIS + row * (ROW + GAP);
    g.fillStyle = "#222";
    g.fillText(`stage ${st.stage} (ranks ${ranksText(st.ranks)})`.slice(0, 24), 2, y + ROW / 2);
    const s = st.slots;
    for (let i = 0; i < s.phase.length; i += 1) {
      if (s.end[i] < t0 || s.start[i] > t1) continue;
      const left = Math.max(x(s.start[i]), LABEL);
      const right = Math.min(x(s.end[i]), width - RIGHT);
      g.globalAlpha = 0.55 + 0.45 * ((s.chunk[i] % 3) / 2);
      g.fillStyle = PHASES[s.phase[i]][1];
      g.fillRect(left, y, Math.max(right - left - 0.5, 0.5), ROW);
    }
    g.globalAlpha = 1;
    if (st.tail_s > 0 && st.end_s <= t1) { // the optimizer step after the last unit
      g.fillStyle = ROLE_COLORS.optimizer;
      const left = Math.max(x(st.end_s), LABEL);
      g.fillRect(left, y, Math.max(x(st.end_s + st.tail_s) - left, 1), ROW);
    }
  });
  if (selected) {
    const row = view.stages.findIndex((st) => st.stage === selected.stage);
    g.strokeStyle = "#000";
    g.lineWidth = 2;
    g.strokeRect(x(selected.start), AXIS + row * (ROW + GAP), x(selected.end) - x(selected.start), ROW);
  }
  return (px, py) => {
    const row = Math.floor((py - AXIS) / (ROW + GAP));
    if (row < 0 || row >= view.stages.length || px < LABEL) return null;
    const st = view.stages[row];
    const t = t0 + ((px - LABEL) / plotW) * (t1 - t0);
    const s = st.slots;
    let lo = 0;
    let hi = s.start.length - 1;
    while (lo < hi) { // the last slot starting at or before t
      const mid = (lo + hi + 1) >> 1;
      if (s.start[mid] <= t) lo = mid; else hi = mid - 1;
    }
    if (s.start[lo] <= t && t <= s.end[lo]) {
      return { stage: st.stage, phase: s.phase[lo], chunk: s.chunk[lo],
        microbatch: s.microbatch[lo], start: s.start[lo], end: s.end[lo] };
    }
    return null;
  };
}

function slotText(slot) {
  return `stage ${slot.stage}: ${PHASES[slot.phase][0]} of model chunk ${slot.chunk}, `
    + `micro-batch ${slot.microbatch}, ${fmtTime(slot.start)} – ${fmtTime(slot.end)} `
    + `(${fmtTime(slot.end - slot.start)})`;
}

/** The ops of one unit, as a table (fetched on demand). */
async function unitTable(planId, slot) {
  const unit = await api(`/api/plans/${planId}/schedule/units/${slot.chunk}/${slot.phase}`);
  const o = unit.ops;
  const order = o.name.map((_, i) => i).sort((a, b) => o.start[a] - o.start[b]);
  return h("div", { id: "schedule-unit" },
    h("h2", {}, `Ops of this unit: ${PHASES[slot.phase][0]} of model chunk ${slot.chunk}`),
    h("p", { class: "muted" }, `${fmtInt(o.name.length)} ops, ${fmtTime(unit.seconds)} per `
      + "micro-batch on a representative rank; every micro-batch of this chunk runs the same."),
    h("table", { "aria-label": "ops of the unit" },
      h("thead", {}, h("tr", {}, ["Op", "Kind", "Stream", "Start", "Duration", "Bytes"]
        .map((c, i) => h("th", i > 2 ? { class: "num" } : {}, c)))),
      h("tbody", {}, order.map((i) => h("tr", {},
        h("td", {}, o.name[i]), h("td", {}, o.kind[i]), h("td", {}, o.stream[i]),
        h("td", { class: "num" }, fmtTime(o.start[i])),
        h("td", { class: "num" }, fmtTime(o.end[i] - o.start[i])),
        h("td", { class: "num" }, o.bytes[i] ? fmtBytes(o.bytes[i]) : ""))))));
}

/** Render the schedule of pipelined plan `planId` into `body`. */
export async function renderSchedule(body, planId, ctx) {
  let view;
  try {
    view = await api(`/api/plans/${planId}/schedule`);
  } catch (err) {
    body.replaceChildren(errorBox(err));
    return;
  }
  if (ctx.signal.aborted) return;
  const q = ctx.query;
  const whole = [0, view.step_time_s];
  let t0 = Number(q.get("t0"));
  let t1 = Number(q.get("t1"));
  if (!(q.get("t0") && q.get("t1") && t1 > t0)) [t0, t1] = whole;
  let selected = null;
  let hit = () => null;

  const canvas = h("canvas", { id: "schedule-canvas", role: "img",
    style: "width:100%;display:block;cursor:crosshair" });
  const tip = h("p", { id: "schedule-tip", class: "muted" },
    "Hover a slot for its unit; click it for its ops; drag across the chart to zoom.");
  const detail = h("div", {});
  const reset = h("button", { type: "button", class: "secondary", id: "schedule-reset" }, "Whole step");
  const legend = h("p", { class: "muted" },
    h("span", { style: `color:${ROLE_COLORS.forward}` }, "■ forward "),
    h("span", { style: `color:${ROLE_COLORS.backward}` }, "■ backward "),
    h("span", { style: `color:${ROLE_COLORS.optimizer}` }, "■ optimizer and gradient sync "),
    "(shade: model chunk)");
  body.replaceChildren(headline(view), h("div", { class: "controls" }, reset), legend, canvas,
    tip, detail);

  const draw = () => {
    hit = paint(canvas, view, t0, t1, selected);
    const n = view.stages.reduce((a, st) => a + st.slots.phase.length, 0);
    canvas.setAttribute("aria-label", `schedule of ${view.pp} stages, ${n} slots, `
      + `${fmtTime(t0)} to ${fmtTime(t1)}`);
    canvas.dataset.t0 = String(t0);
    canvas.dataset.t1 = String(t1);
  };
  const zoom = (a, b) => {
    [t0, t1] = [a, b];
    ctx.setQuery({ t0: a === whole[0] && b === whole[1] ? null : a,
      t1: a === whole[0] && b === whole[1] ? null : b });
    draw();
  };
  reset.addEventListener("click", () => zoom(...whole));

  const timeAt = (px) => {
    const plotW = canvasWidth(canvas) - LABEL - RIGHT;
    return Math.min(Math.max(t0 + ((px - LABEL) / plotW) * (t1 - t0), t0), t1);
  };
  let dragFrom = null;
  canvas.addEventListener("mousedown", (ev) => { dragFrom = ev.offsetX; });
  canvas.addEventListener("mousemove", (ev) => {
    const slot = hit(ev.offsetX, ev.offsetY);
    tip.textContent = slot ? slotText(slot) : "Hover a slot for its unit; click it for its "
      + "ops; drag across the chart to zoom.";
  });
  canvas.addEventListener("mouseup", async (ev) => {
    const from = dragFrom;
    dragFrom = null;
    if (from !== null && Math.abs(ev.offsetX - from) > 5) {
      const [a, b] = [timeAt(Math.min(from, ev.offsetX)), timeAt(Math.max(from, ev.offsetX))];
      if (b > a) zoom(a, b);
      return;
    }
    const slot = hit(ev.offsetX, ev.offsetY);
    if (!slot) return;
    selected = slot;
    draw();
    detail.replaceChildren(h("p", { class: "loading" }, "loading the unit's ops…"));
    try {
      detail.replaceChildren(h("p", { id: "schedule-selected" }, slotText(slot)),
        await unitTable(planId, slot));
    } catch (err) {
      detail.replaceChildren(errorBox(err));
    }
  });
  const onResize = () => draw();
  window.addEventListener("resize", onResize);
  ctx.signal.addEventListener("abort", () => window.removeEventListener("resize", onResize));
  draw();
}
