// Timeline view (#/plans/:id/timeline?stage=&rank=&t0=&t1=): the simulated step of one pass
// stage, ranks x streams on a numeric time axis (ms). Compute and communication are coloured
// by op role, exposed communication is outlined in red. Zooming records the window in the URL
// (t0, t1 in seconds, as the API takes them) and refetches it, so bars the API merged split
// into single ops as you zoom in. A pipelined plan's timeline is its schedule (schedule.js).
// A plan measured on real ranks (measured.js) shows its measured op spans as thin bars under
// the predicted ones of the last stage, and the comparison below the chart.
// Every representative rank (one per role) gets its lanes, the first labelled with the ranks it
// stands for; below the chart, time per op kind (timeline_stats.js); two toggles outline the
// critical path and draw collective -> wait arrows (critical_path.js).
import { api, ApiError } from "../api.js";
import {
  errorBox, fmtBytes, fmtInt, fmtPercent, fmtTime, h, planTabs, plotly, ranksText, ROLE_COLORS,
} from "../ui.js";
import { loadMeasured, measuredScale, measuredSection, measuredTraces } from "./measured.js";
import { renderSchedule } from "./schedule.js";
import { criticalPath, criticalTrace, flowAnnotations, flows } from "./critical_path.js";
import { kindStats, standsFor } from "./timeline_stats.js";

const EXPOSED = "#7a0010";
const ROLES = ["forward", "loss", "backward", "optimizer", "comm"];

/** Escape text for Plotly's HTML-ish hover labels. */
function esc(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

/** The plan if it is built and costed; otherwise null, with the reason shown in `body`
 * (asked before the cost endpoints, which would answer 404 / 409). */
export async function costedPlan(id, body) {
  const plan = await api(`/api/plans/${id}`);
  let why = null;
  if (plan.status !== "succeeded") {
    why = `plan ${id} is not built: its job is ${plan.status}`
      + (plan.status === "running" ? ` (${fmtPercent(plan.progress)})` : "");
  } else if (!plan.cluster) {
    why = `plan ${id} has no cost: it was planned without a cluster`;
  }
  if (why === null) return plan;
  body.replaceChildren(h("div", { class: "error", role: "alert" }, why, ". ",
    h("a", { href: `#/plans/${id}` }, "Back to the plan's overview"), "."));
  return null;
}

function figure(label, value, title) {
  return h("div", { class: "figure", title },
    h("div", { class: "muted" }, label), h("div", { class: "value" }, value));
}

/** The y row of an event: "rank R · stream". */
function rowOf(e) {
  return `rank ${e.rank} · ${e.stream}`;
}

function hover(e) {
  const dur = e.end - e.start;
  const lines = [
    `<b>${esc(e.name)}</b>`,
    `${esc(e.kind)} · ${esc(e.role)} · scope ${esc(e.scope || "(none)")}`,
    `${fmtTime(dur)} (${(e.start * 1e3).toFixed(4)}–${(e.end * 1e3).toFixed(4)} ms)`,
  ];
  if (e.count > 1) lines.push(`${fmtInt(e.count)} ops merged, busy ${fmtTime(e.busy)}`);
  if (e.bytes) lines.push(`${fmtBytes(e.bytes)} per rank`);
  if (e.exposed > 0) lines.push(`exposed ${fmtTime(e.exposed)}`);
  if (e.deps?.length) {
    const shown = e.deps.slice(0, 6).map(esc).join("<br>  ");
    lines.push(`after:<br>  ${shown}${e.deps.length > 6 ? `<br>  … ${e.deps.length - 6} more` : ""}`);
  }
  return lines.join("<br>");
}

/** Plotly traces: one bar trace per role, and the exposed-comm outlines on top. */
export function traces(data) {
  const out = [];
  for (const role of ROLES) {
    const events = data.events.filter((e) => e.role === role);
    if (!events.length) continue;
    out.push({
      type: "bar",
      orientation: "h",
      name: role,
      y: events.map(rowOf),
      base: events.map((e) => e.start * 1e3),
      x: events.map((e) => Math.max((e.end - e.start) * 1e3, 0)),
      hovertext: events.map(hover),
      hoverinfo: "text",
      marker: { color: ROLE_COLORS[role] ?? "#888", line: { width: 0 } },
      width: 0.7,
    });
  }
  const exposed = data.events.filter((e) => e.exposed > 0);
  out.push({
    type: "bar",
    orientation: "h",
    name: "exposed comm",
    y: exposed.map(rowOf),
    base: exposed.map((e) => e.start * 1e3),
    x: exposed.map((e) => (e.end - e.start) * 1e3),
    hovertext: exposed.map(hover),
    hoverinfo: "text",
    marker: {
      color: "rgba(0,0,0,0)",
      pattern: { shape: "/", fgcolor: EXPOSED, size: 6, solidity: 0.3 },
      line: { color: EXPOSED, width: 2 },
    },
    width: 0.9,
  });
  return out;
}

/** Every stream of every shown rank, compute first: rows stay put while zooming. */
function rows(data) {
  return data.ranks.flatMap((rank) => data.streams.map((s) => `rank ${rank.rank} · ${s}`));
}

/** The lane labels: each rank's first lane says which ranks it stands for (its role). */
function rowLabels(data) {
  return data.ranks.flatMap((rank) => data.streams.map((s, i) => (i === 0
    ? `rank ${rank.rank} (${standsFor(rank)}) · ${s}`
    : `rank ${rank.rank} · ${s}`)));
}

function layout(data, range) {
  const rowNames = rows(data);
  return {
    barmode: "overlay",
    height: Math.max(260, 90 + 34 * rowNames.length),
    margin: { l: 250, r: 20, t: 10, b: 50 },
    xaxis: {
      title: { text: "time in step (ms)" },
      type: "linear",
      ...(range ? { range } : {}), // no `range: null`: Plotly.react's kept zoom would set into it
      autorange: range ? false : true,
      zeroline: false,
    },
    yaxis: {
      type: "category",
      categoryorder: "array",
      categoryarray: rowNames,
      tickmode: "array",
      tickvals: rowNames,
      ticktext: rowLabels(data),
      autorange: "reversed",
    },
    legend: { orientation: "h", y: 1.02, yanchor: "bottom", x: 0 },
    hoverlabel: { align: "left" },
    // a new window (URL, "Whole step") applies; otherwise the user's zoom and pan are kept
    uirevision: range ? range.join("-") : "whole",
  };
}

function headline(data) {
  const f = data.figures;
  return h("div", { class: "figures", "aria-label": "headline figures" },
    h("div", { class: "figure", id: "step-time", "data-seconds": data.step_time_s },
      h("div", { class: "muted" }, "step time"), h("div", { class: "value" }, fmtTime(data.step_time_s))),
    figure("exposed comm", fmtTime(f.exposed_comm_s), "communication not hidden behind compute (rank 0)"),
    figure("overlap", fmtPercent(f.overlap_fraction), "share of communication hidden behind compute (rank 0)"),
    figure("compute", fmtTime(f.compute_s), "compute-stream busy time (rank 0)"),
    figure("MFU", fmtPercent(f.mfu), "model FLOPs utilisation"));
}

function notice(data) {
  const shown = data.events.length;
  if (data.aggregated) {
    return h("p", { class: "muted", id: "timeline-note" },
      `${fmtInt(data.total_events)} ops in this window, merged into ${fmtInt(shown)} bars `
      + "(same rank, stream and role); zoom in to see single ops.");
  }
  return h("p", { class: "muted", id: "timeline-note" },
    `${fmtInt(shown)} ops in this window.`);
}

export async function render(root, ctx) {
  const id = ctx.params.id;
  const q = ctx.query;
  const state = {
    stage: q.get("stage") || null,
    rank: q.get("rank") || null,
    t0: q.get("t0") !== null && q.get("t0") !== "" ? Number(q.get("t0")) : null,
    t1: q.get("t1") !== null && q.get("t1") !== "" ? Number(q.get("t1")) : null,
  };
  if (!(Number.isFinite(state.t0) && Number.isFinite(state.t1) && state.t1 > state.t0)) {
    state.t0 = null;
    state.t1 = null;
  }
  const permalink = () => {
    const p = new URLSearchParams();
    for (const key of ["stage", "rank", "t0", "t1"]) if (state[key] !== null) p.set(key, state[key]);
    return p.toString();
  };
  const tabs = h("div", {}, planTabs(id, "timeline", permalink()));
  const title = h("h1", {}, `Plan ${id} · timeline`);
  const body = h("div", {}, h("p", { class: "loading" }, "loading…"));
  root.append(tabs, title, body);

  const fetchTimeline = () => {
    const p = new URLSearchParams();
    if (state.stage) p.set("stage", state.stage);
    if (state.rank !== null) p.set("rank", state.rank);
    if (state.t0 !== null) { p.set("t0", state.t0); p.set("t1", state.t1); }
    return api(`/api/plans/${id}/timeline?${p}`);
  };

  let data;
  let plan;
  try {
    plan = await costedPlan(id, body);
    if (!plan) return;
    if (plan.summary?.pipeline) { // a pipelined step is its schedule: slots by stage
      title.textContent = `Plan ${id} · timeline (pipeline schedule)`;
      await renderSchedule(body, id, ctx);
      const [found, live] = await Promise.all([
        loadMeasured(id).catch(() => null), api("/api/workers").catch(() => [])]);
      body.append(measuredSection({ planId: id, mesh: plan.summary.mesh, workers: live,
        measured: found, overlay: false, onChange: () => {} }).element); // the table, no overlay
      return;
    }
    data = await fetchTimeline();
  } catch (err) {
    if (err instanceof ApiError && err.status === 404 && err.detail?.resource === "stage") {
      state.stage = null; // a permalink to a stage this plan no longer has: show the last
      ctx.setQuery({ stage: null });
      data = await fetchTimeline();
    } else {
      body.replaceChildren(errorBox(err));
      return;
    }
  }
  if (ctx.signal.aborted) return;
  const Plotly = await plotly();

  const stageSelect = h("select", { id: "timeline-stage" },
    data.stages.map((name) => h("option", { value: name, selected: name === data.stage }, name)));
  const rankSelect = h("select", { id: "timeline-rank" },
    h("option", { value: "" }, data.representatives.length === 1
      ? "every rank (one role)" : `every role (${data.representatives.length} ranks)`),
    data.representatives.map((r) => h("option", { value: r.rank },
      `rank ${r.rank} (stands for ${ranksText(r.stands_for)})`)));
  const rep = data.ranks.length === 1 && state.rank !== null ? data.ranks[0].rank : "";
  rankSelect.value = String(rep);
  const criticalBox = h("input", { type: "checkbox", id: "timeline-critical" });
  const flowBox = h("input", { type: "checkbox", id: "timeline-flows" });
  const resetZoom = h("button", { type: "button", class: "secondary", id: "timeline-reset" },
    "Whole step");
  const controls = h("div", { class: "controls", style: "display:flex;gap:1.5rem;align-items:end;flex-wrap:wrap" },
    h("div", {}, h("label", { for: "timeline-stage" }, "Stage (timeline after each pass)"), stageSelect),
    h("div", {}, h("label", { for: "timeline-rank" }, "Rank"), rankSelect),
    h("div", {}, resetZoom),
    h("div", { class: "overlay-toggles" },
      h("label", { class: "check" }, criticalBox, " Critical path"),
      h("label", { class: "check" }, flowBox, " Collective → wait arrows")),
    h("div", {},
      h("a", { href: `/api/plans/${id}/trace`, download: `plan-${id}-trace.json`, id: "trace-link" },
        "Download Chrome trace"),
      h("span", { class: "muted" }, " — open in Perfetto (",
        h("a", { href: "https://ui.perfetto.dev", target: "_blank", rel: "noopener" }, "ui.perfetto.dev"),
        ")")));
  const figures = h("div", {});
  const note = h("div", {});
  const represents = h("p", { class: "muted" });
  const plot = h("div", { id: "timeline-plot", role: "img", "aria-label": "timeline of the step" });
  const stats = h("div", {});
  const [stored, workers] = await Promise.all([
    loadMeasured(id).catch(() => null), api("/api/workers").catch(() => [])]);
  let measured = stored;
  const measuredPart = measuredSection({ planId: id, mesh: plan.summary.mesh, workers, measured,
    overlay: true,
    onChange: (m) => {
      measured = m;
      if (!ctx.signal.aborted) draw().catch((err) => note.replaceChildren(errorBox(err)));
    } });
  body.replaceChildren(controls, figures, represents, note, plot, stats, measuredPart.element);

  const range = () => (state.t0 !== null ? [state.t0 * 1e3, state.t1 * 1e3] : null);
  /** The predicted bars and, on the last stage (the program that ran), the measured ones. */
  const allTraces = () => {
    const last = data.stages[data.stages.length - 1];
    const over = measured !== null && data.stage === last;
    if (measured !== null && !over) {
      note.append(h("p", { class: "muted" }, `The measured spans are drawn on the last stage `
        + `(${last}): the program that ran.`));
    }
    if (!over) return traces(data);
    const predicted = traces(data).map((t) => ({ ...t, legendgroup: "predicted",
      legendgrouptitle: { text: "predicted" } }));
    const scale = measuredScale(measured, measuredPart.scaled());
    return [...predicted, ...measuredTraces(measured, data.ranks.map((r) => r.rank), scale)];
  };
  let drawing = false;
  const draw = async () => {
    figures.replaceChildren(headline(data));
    note.replaceChildren(notice(data));
    represents.textContent = data.ranks
      .map((r) => `rank ${r.rank} stands for ranks ${ranksText(r.stands_for)}`).join("; ")
      + ". Ranks whose groups sit alike on the nodes take the same time; one is simulated for them.";
    plot.setAttribute("aria-label", `timeline of stage ${data.stage}: ${data.events.length} bars`);
    stats.replaceChildren(kindStats(data));
    tabs.replaceChildren(planTabs(id, "timeline", permalink()));
    drawing = true;
    try {
      const shown = allTraces();
      const look = layout(data, range());
      // both overlays need single ops (merged bars carry no deps)
      for (const box of [criticalBox, flowBox]) {
        box.disabled = data.aggregated;
        box.title = data.aggregated ? "zoom in until the bars are single ops" : "";
      }
      if (criticalBox.checked && !data.aggregated) shown.push(criticalTrace(criticalPath(data)));
      if (flowBox.checked && !data.aggregated) {
        look.annotations = flowAnnotations(flows(data), rows(data));
      }
      if (shown.some((t) => t.legendgroup === "measured")) { // room for the grouped legend
        look.margin.t = 160;
        look.height += 150;
      }
      await Plotly.react(plot, shown, look, { responsive: true, displaylogo: false });
    } finally {
      drawing = false;
    }
  };

  let seq = 0;
  const reload = async () => {
    const mine = ++seq;
    try {
      const next = await fetchTimeline();
      if (mine !== seq || ctx.signal.aborted) return;
      data = next;
      await draw();
    } catch (err) {
      if (!ctx.signal.aborted) note.replaceChildren(errorBox(err));
    }
  };

  stageSelect.addEventListener("change", () => {
    state.stage = stageSelect.value;
    ctx.setQuery({ stage: state.stage });
    reload();
  });
  rankSelect.addEventListener("change", () => {
    state.rank = rankSelect.value === "" ? null : rankSelect.value;
    ctx.setQuery({ rank: state.rank });
    reload();
  });
  for (const box of [criticalBox, flowBox]) {
    box.addEventListener("change", () => draw().catch((err) => note.replaceChildren(errorBox(err))));
  }
  resetZoom.addEventListener("click", () => {
    state.t0 = null;
    state.t1 = null;
    ctx.setQuery({ t0: null, t1: null });
    reload();
  });

  await draw();
  let timer = null;
  plot.on("plotly_relayout", (ev) => {
    if (drawing) return;
    if (ev["xaxis.autorange"]) {
      if (state.t0 === null) return;
      state.t0 = null;
      state.t1 = null;
    } else if (ev["xaxis.range[0]"] !== undefined || Array.isArray(ev["xaxis.range"])) {
      const [lo, hi] = ev["xaxis.range"] ?? [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];
      const t0 = Math.max(0, Number(lo) / 1e3);
      const t1 = Number(hi) / 1e3;
      if (!(t1 > t0) || (t0 === state.t0 && t1 === state.t1)) return;
      state.t0 = t0;
      state.t1 = t1;
    } else {
      return;
    }
    ctx.setQuery({ t0: state.t0, t1: state.t1 });
    clearTimeout(timer);
    timer = setTimeout(reload, 150);
  });
  ctx.signal.addEventListener("abort", () => {
    clearTimeout(timer);
    Plotly.purge(plot);
  });
}
