// The measured step beside the predicted one (timeline view). "Measure on real ranks", shown
// when a live worker can serve the plan's ranks (GET /api/workers, the rule of the overview's
// "Run for real"), queues a measurement (POST /api/plans/:id/measurements), follows its job,
// then the timeline draws every measured op span as a thin dark bar under the predicted bars of
// its rank and stream (`measuredTraces`), and this section shows the comparison rows (step,
// compute, communication, per op kind; per layer folded) with their error %. A stored
// measurement (GET /api/plans/:id/measured, once one of GET /api/plans/:id/measurements
// succeeded) is drawn on load.
import { api, followJob } from "../api.js";
import { errorBox, fmtTime, h } from "../ui.js";
import { meshSize, realDevice } from "./plan.js";

export const MEASURED_COLOR = "#1b1b1b";
/** Where the thin measured bar sits in a lane: under the predicted bars (width 0.7). */
const BAR = { width: 0.16, offset: 0.36 };

/** The plan's latest measurement, or null when none succeeded (asked of its measurement
 * jobs first: the view's 404 would be a console error). */
export async function loadMeasured(planId) {
  const jobs = await api(`/api/plans/${planId}/measurements`);
  if (!jobs.some((job) => job.status === "succeeded")) return null;
  return api(`/api/plans/${planId}/measured`);
}

/** What measured seconds are multiplied by when drawn: 1, or (scaled) the predicted step over
 * the measured one, so the two steps span the same width and their shapes compare. */
export function measuredScale(measured, scaled) {
  const { predicted_step_s: p, measured_step_s: m } = measured;
  return scaled && m > 0 && p > 0 ? p / m : 1;
}

function esc(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

/** One Plotly bar trace: the measured op spans of `ranks` (those the timeline shows), each a
 * thin bar under its lane's predicted bars; times in ms, multiplied by `scale`. */
export function measuredTraces(measured, ranks, scale) {
  const shown = new Set(ranks.map(Number));
  const ops = measured.ops;
  const trace = { y: [], base: [], x: [], hovertext: [] };
  for (const r of measured.ranks) {
    if (!shown.has(r.rank)) continue;
    r.op.forEach((i, k) => {
      const start = r.start_s[k];
      const end = r.end_s[k];
      trace.y.push(`rank ${r.rank} · ${ops.stream[i]}`);
      trace.base.push(start * scale * 1e3);
      trace.x.push(Math.max((end - start) * scale * 1e3, 0));
      trace.hovertext.push([`<b>${esc(ops.name[i])}</b> (measured)`,
        `${esc(ops.kind[i])} · ${esc(ops.role[i])}`,
        `${fmtTime(end - start)} (${(start * 1e3).toFixed(4)}–${(end * 1e3).toFixed(4)} ms, `
        + `median step of rank ${r.rank})`].join("<br>"));
    });
  }
  const name = scale === 1 ? "measured op" : `measured op (× ${scale.toPrecision(3)})`;
  return [{
    type: "bar", orientation: "h", name, ...trace, hoverinfo: "text",
    legendgroup: "measured", legendgrouptitle: { text: "measured" },
    marker: { color: MEASURED_COLOR, line: { width: 0 } }, ...BAR,
  }];
}

function pct(value) {
  if (value === null || value === undefined) return "–";
  return `${value >= 0 ? "+" : ""}${value.toFixed(1)}%`;
}

function rowsTable(rows, label) {
  return h("table", { "aria-label": label, class: "measured-rows" },
    h("thead", {}, h("tr", {}, ["", "Predicted", "Measured", "Error"].map((t, i) =>
      h("th", { class: i ? "num" : null }, t)))),
    h("tbody", {}, rows.map((r) => h("tr", { "data-group": r.group },
      h("td", {}, r.group === "kind" ? h("code", {}, r.name) : r.name),
      h("td", { class: "num" }, fmtTime(r.predicted_s)),
      h("td", { class: "num" }, fmtTime(r.measured_s)),
      h("td", { class: "num", title: "(predicted − measured) / measured" }, pct(r.error_pct))))));
}

/** The comparison: the step (a pipeline's: per stage too), compute and communication, per
 * op kind, and per layer (folded). */
export function comparisonTables(measured) {
  const of = (...groups) => measured.rows.filter((r) => groups.includes(r.group));
  const layers = of("layer");
  return h("div", { id: "measured-comparison" },
    rowsTable(of("step", "stage", "total", "kind"), "predicted against measured"),
    layers.length ? h("details", {}, h("summary", {}, `Per layer (${layers.length})`),
      rowsTable(layers, "predicted against measured per layer")) : null);
}

function summaryLine(m) {
  const step = m.rows.find((r) => r.group === "step");
  return h("p", { id: "measured-summary" },
    `Measured ${m.steps} steps (after ${m.warmup} warm-up) on ${m.nproc} torch ranks `
    + `(${m.device}; ${m.backend}, ${m.compute_dtype}): step ${fmtTime(step.measured_s)} `
    + `against ${fmtTime(step.predicted_s)} predicted (error ${pct(step.error_pct)}). `,
    h("a", { href: `/api/plans/${m.plan_id}/measured/trace`, download: "", id: "measured-trace-link" },
      "Download the measured Chrome trace"));
}

/** The section: what was measured, the comparison, "Measure on real ranks" (when a worker can
 * serve it) and the "scale to the predicted step" switch. `onChange(measured)` is called
 * when a new measurement arrives or the scale switch flips; `scaled()` reads the switch. */
export function measuredSection({ planId, mesh, workers, measured, overlay, onChange }) {
  const ranks = meshSize(mesh);
  const device = realDevice(workers, ranks);
  const out = h("div", { "aria-live": "polite", id: "measured-status" });
  const content = h("div", {});
  const scale = h("input", { type: "checkbox", id: "measured-scale" });
  const scaleLabel = h("label", { for: "measured-scale", style: "display:inline" }, scale,
    " Draw measured spans scaled to the predicted step");
  let current = measured;
  const show = () => {
    if (!current) {
      content.replaceChildren(h("p", { class: "muted", id: "measured-none" },
        "Not measured yet: measuring times this plan's program on one torch process per rank "
        + "and draws the measured op spans under the predicted ones."));
      return;
    }
    const far = current.measured_step_s > 2 * current.predicted_step_s
      || current.predicted_step_s > 2 * current.measured_step_s;
    if (scale.dataset.touched !== "1") scale.checked = far;
    content.replaceChildren(summaryLine(current),
      overlay ? h("p", {}, scaleLabel, h("span", { class: "muted" },
        " — the ranks compute with numpy on this worker's CPU, so the measured step is "
        + "not the cluster's; scaled, the shapes compare.")) : null,
      comparisonTables(current));
  };
  scale.addEventListener("change", () => {
    scale.dataset.touched = "1";
    onChange(current);
  });
  const button = device ? h("button", { type: "button", id: "measure-button",
    title: `time the step on ${ranks} torch ranks (${device}) on a worker that has them` },
  "Measure on real ranks") : null;
  button?.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const created = await api(`/api/plans/${planId}/measurements`,
        { method: "POST", body: { nproc: ranks, device } });
      const bar = h("progress", { max: 1, value: 0, "aria-label": "measurement progress" });
      const note = h("span", { class: "muted" }, "queued");
      out.replaceChildren(bar, " ", note);
      const job = await followJob(created.job_id, (j) => {
        bar.value = j.progress; note.textContent = j.message;
      });
      if (job?.status !== "succeeded") {
        out.replaceChildren(errorBox(new Error(job?.error?.message ?? `measurement ${job?.status}`)));
        return;
      }
      out.replaceChildren();
      current = await loadMeasured(planId);
      show();
      onChange(current);
    } catch (err) {
      out.replaceChildren(errorBox(err));
    } finally {
      button.disabled = false;
    }
  });
  show();
  return {
    element: h("section", { "aria-label": "measured step", id: "measured-section" },
      h("h2", {}, "Measured step"), content, button, out),
    scaled: () => scale.checked,
  };
}
