// Memory view (#/plans/:id/memory?stage=): per profiled rank, what is live at the peak by
// category (stacked bar) against the device's capacity, live bytes over the step, and the
// largest buffers at the peak. A pipelined plan shows memory per stage (stage_memory.js).
import { api, ApiError } from "../api.js";
import {
  binaryTicks, CATEGORY_COLORS, errorBox, fmtBytes, fmtPercent, h, planTabs, plotly, ranksText,
} from "../ui.js";
import { whatIf } from "./memory_whatif.js";
import { renderStageMemory } from "./stage_memory.js";
import { costedPlan } from "./timeline.js";

const CAPACITY = "#b3261e";

function share(fraction) {
  return fraction > 0 && fraction < 0.001 ? "< 0.1%" : fmtPercent(fraction);
}

function fitText(rank) {
  const used = share(rank.peak_bytes / rank.capacity_bytes);
  if (rank.fits) {
    return h("p", { class: "fits status-succeeded", "data-peak": rank.peak_bytes },
      `Peak ${fmtBytes(rank.peak_bytes)} of ${fmtBytes(rank.capacity_bytes)} `
      + `(${used}) — fits, ${fmtBytes(rank.headroom_bytes)} to spare.`);
  }
  return h("p", { class: "fits status-failed", "data-peak": rank.peak_bytes },
    `Peak ${fmtBytes(rank.peak_bytes)} of ${fmtBytes(rank.capacity_bytes)} `
    + `(${used}) — does not fit: ${fmtBytes(-rank.headroom_bytes)} over.`);
}

/** The stacked bar (one per rank) of the breakdown at the peak, with the capacity line. */
function breakdownFigure(data, toCapacity) {
  const labels = Object.keys(data.categories);
  const x = data.ranks.map((r) => `rank ${r.rank}`);
  const traces = labels.map((label) => ({
    type: "bar",
    name: label,
    x,
    y: data.ranks.map((r) => r.breakdown[label]),
    hovertext: data.ranks.map((r) => `${label}: ${fmtBytes(r.breakdown[label])}`
      + `<br>(${data.categories[label].join(" + ")})`),
    hoverinfo: "text",
    marker: { color: CATEGORY_COLORS[label] },
    width: data.ranks.length === 1 ? 0.35 : undefined,
  }));
  const peak = Math.max(...data.ranks.map((r) => r.peak_bytes));
  const top = toCapacity ? Math.max(peak, data.capacity_bytes) * 1.08 : peak * 1.15;
  const ticks = binaryTicks(top);
  return {
    traces,
    layout: {
      barmode: "stack",
      height: 380,
      margin: { l: 70, r: 20, t: 30, b: 40 },
      yaxis: { title: { text: `bytes per rank (${ticks.title})` }, range: [0, top],
        tickvals: ticks.tickvals, ticktext: ticks.ticktext },
      legend: { orientation: "h", y: 1.12, x: 0 },
      shapes: [{
        type: "line", xref: "paper", x0: 0, x1: 1, yref: "y",
        y0: data.capacity_bytes, y1: data.capacity_bytes,
        line: { color: CAPACITY, width: 2, dash: "dash" },
        name: "capacity",
      }],
      annotations: [{
        xref: "paper", x: 1, xanchor: "right",
        yref: toCapacity ? "y" : "paper", y: toCapacity ? data.capacity_bytes : 1,
        yanchor: "bottom", showarrow: false, font: { color: CAPACITY },
        text: `capacity ${fmtBytes(data.capacity_bytes)}${toCapacity ? "" : " (above this scale)"}`,
      }],
    },
  };
}

function seriesFigure(rank) {
  const s = rank.series;
  const timed = s.t.every((t) => t !== null);
  const x = timed ? s.t.map((t) => t * 1e3) : s.index;
  const top = Math.max(rank.peak_bytes, ...s.bytes) * 1.08;
  const ticks = binaryTicks(top);
  return {
    traces: [{
      type: "scatter",
      mode: "lines",
      line: { shape: "hv", color: "#2f5fd0" },
      name: "live bytes",
      x,
      y: s.bytes,
      hovertext: s.op.map((op, i) => `${op}<br>${fmtBytes(s.bytes[i])}`),
      hoverinfo: "text",
    }, {
      type: "scatter",
      mode: "markers",
      name: "peak",
      x: [x[s.op.indexOf(rank.peak_op)]],
      y: [rank.peak_bytes],
      marker: { color: CAPACITY, size: 9 },
      hovertext: [`peak at ${rank.peak_op}<br>${fmtBytes(rank.peak_bytes)}`],
      hoverinfo: "text",
    }],
    layout: {
      height: 300,
      margin: { l: 70, r: 20, t: 10, b: 50 },
      xaxis: { title: { text: timed ? "op start in the step (ms)" : "op (program order)" } },
      yaxis: { title: { text: `live bytes (${ticks.title})` }, range: [0, top],
        tickvals: ticks.tickvals, ticktext: ticks.ticktext },
      showlegend: false,
    },
  };
}

function buffersTable(rank) {
  return h("table", { "aria-label": `largest buffers at the peak, rank ${rank.rank}` },
    h("thead", {}, h("tr", {}, h("th", {}, "Buffer"), h("th", {}, "Category"),
      h("th", {}, "Made by scope"), h("th", { class: "num" }, "Bytes"))),
    h("tbody", {}, rank.largest_buffers.map((b) => h("tr", {},
      h("td", {}, h("code", {}, b.value)),
      h("td", {}, b.label, b.label !== b.category ? h("span", { class: "muted" }, ` (${b.category})`) : null),
      h("td", {}, b.scope || h("span", { class: "muted" }, "(source)")),
      h("td", { class: "num" }, fmtBytes(b.bytes))))));
}

function breakdownTable(rank, categories) {
  return h("table", { "aria-label": `breakdown at the peak, rank ${rank.rank}` },
    h("thead", {}, h("tr", {}, h("th", {}, "Category"), h("th", { class: "num" }, "Bytes"),
      h("th", {}, "Cost-model categories"))),
    h("tbody", {},
      Object.entries(rank.breakdown).map(([label, bytes]) => h("tr", {},
        h("td", {}, label), h("td", { class: "num" }, fmtBytes(bytes)),
        h("td", { class: "muted" }, categories[label].map((c) =>
          `${c} ${fmtBytes(rank.breakdown_detail[c] ?? 0)}`).join(", ")))),
      h("tr", {}, h("th", {}, "peak"), h("th", { class: "num" }, fmtBytes(rank.peak_bytes)),
        h("td", { class: "muted" }, `at op ${rank.peak_op}`))));
}

export async function render(root, ctx) {
  const id = ctx.params.id;
  let stage = ctx.query.get("stage") || null;
  const tabs = h("div", {}, planTabs(id, "memory", stage ? `stage=${encodeURIComponent(stage)}` : ""));
  const body = h("div", {}, h("p", { class: "loading" }, "loading…"));
  root.append(tabs, h("h1", {}, `Plan ${id} · memory`), body);
  const load = () => api(`/api/plans/${id}/memory${stage ? `?stage=${encodeURIComponent(stage)}` : ""}`);

  let data;
  let plan;
  try {
    plan = await costedPlan(id, body);
    if (!plan) return;
    if (plan.summary?.pipeline) { // per stage, as the schedule holds it
      await renderStageMemory(body, plan.summary.pipeline, ctx, plan);
      return;
    }
    data = await load();
  } catch (err) {
    if (err instanceof ApiError && err.status === 404 && err.detail?.resource === "stage") {
      stage = null;
      ctx.setQuery({ stage: null });
      data = await load();
    } else {
      body.replaceChildren(errorBox(err));
      return;
    }
  }
  if (ctx.signal.aborted) return;
  const Plotly = await plotly();

  const select = h("select", { id: "memory-stage" },
    data.stages.map((name) => h("option", { value: name, selected: name === data.stage }, name)));
  const scale = h("input", { type: "checkbox", id: "memory-to-capacity" });
  const controls = h("div", { style: "display:flex;gap:1.5rem;align-items:end;flex-wrap:wrap" },
    h("div", {}, h("label", { for: "memory-stage" }, "Stage (memory after each pass)"), select),
    h("div", { style: "display:flex;gap:.4rem;align-items:center" }, scale,
      h("label", { for: "memory-to-capacity", style: "font-weight:normal;margin:0" },
        "scale up to the device's capacity")));
  const content = h("div", {});
  body.replaceChildren(controls, content);
  // a plan that does not fit: the changes to try, above the charts
  const worst = data.ranks.reduce((w, r) => (r.peak_bytes > w.peak_bytes ? r : w));
  const fixes = worst.fits ? null : await whatIf(plan, `Rank ${worst.rank} needs `
    + `${fmtBytes(worst.peak_bytes)} of ${fmtBytes(worst.capacity_bytes)}: it does not fit.`);
  if (ctx.signal.aborted) return;
  const plots = [];

  const draw = async () => {
    for (const p of plots.splice(0)) Plotly.purge(p);
    const peak = Math.max(...data.ranks.map((r) => r.peak_bytes));
    const toCapacity = scale.checked;
    const bar = h("div", { id: "memory-breakdown", role: "img",
      "aria-label": "memory at the peak by category, with the device capacity" });
    const cards = data.ranks.map((rank) => {
      const line = h("div", { class: "memory-series", role: "img",
        "aria-label": `live bytes over the step, rank ${rank.rank}` });
      plots.push(line);
      return { rank, line, card: h("section", { class: "card" },
        h("h2", {}, `Rank ${rank.rank}`, h("span", { class: "muted" },
          ` · stands for ranks ${ranksText(rank.stands_for)}`)),
        fitText(rank),
        h("div", { style: "display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:1rem" },
          h("div", {}, h("h3", {}, "Breakdown at the peak"), breakdownTable(rank, data.categories)),
          h("div", {}, h("h3", {}, "Largest buffers at the peak"), buffersTable(rank))),
        h("h3", {}, "Live bytes over the step"), line) };
    });
    plots.push(bar);
    content.replaceChildren(
      h("p", { class: "muted" },
        `${data.cluster}: ${fmtBytes(data.capacity_bytes)} per device. The cost model profiles `
        + "one rank: every rank holds equal blocks, so it stands for the others."),
      ...(fixes ? [fixes] : []),
      h("section", { class: "card" }, h("h2", {}, "Peak memory by category"), bar),
      ...cards.map((c) => c.card));
    const fig = breakdownFigure(data, toCapacity);
    await Plotly.react(bar, fig.traces, fig.layout, { responsive: true, displaylogo: false });
    for (const { rank, line } of cards) {
      const s = seriesFigure(rank);
      await Plotly.react(line, s.traces, s.layout, { responsive: true, displaylogo: false });
    }
    bar.dataset.peak = String(peak);
  };

  scale.checked = Math.max(...data.ranks.map((r) => r.peak_bytes)) >= 0.05 * data.capacity_bytes;
  scale.addEventListener("change", draw);
  select.addEventListener("change", async () => {
    stage = select.value;
    ctx.setQuery({ stage });
    tabs.replaceChildren(planTabs(id, "memory", `stage=${encodeURIComponent(stage)}`));
    try {
      data = await load();
      if (!ctx.signal.aborted) await draw();
    } catch (err) {
      content.replaceChildren(errorBox(err));
    }
  });
  ctx.signal.addEventListener("abort", () => { for (const p of plots) Plotly.purge(p); });
  await draw();
}
