// Find a strategy (#/search?id=): a model made from a preset and a cluster in, the search's
// live progress, then every evaluated candidate as a point of step time against peak memory
// per rank (coloured by mesh shape; those that do not fit greyed, their reason on hover),
// the Pareto front as a line, why the winner won, and the ranked list (one row per plan: the
// recipes with an identical plan listed under it). Clicking a point or
// a row's button stores that candidate as a strategy and builds its plan.
import { api, followJob } from "../api.js";
import { clearErrors, field, fieldOf, labelled, showError } from "../forms.js";
import { errorBox, fmtBytes, fmtPercent, fmtTime, h, plotly } from "../ui.js";

const GIB = 1024 ** 3;
const GREY = "#b0b0b0";

function numberInput(id, placeholder, attrs = {}) {
  return h("input", { id, type: "number", placeholder, style: "width: 8rem", ...attrs });
}

/** A label and its control (with what follows it, e.g. its error line) as two grid cells. */
function row(text, control, ...after) {
  const [label, input] = labelled(text, control);
  return [label, h("div", {}, input, ...after)];
}

/** The search form; `onSearch(body)` gets the request. */
function searchForm(models, clusters, onSearch) {
  const presets = models.filter((m) => m.source === "preset");
  const model = h("select", { id: "search-model" },
    presets.map((m) => h("option", { value: m.id }, `${m.name} (${m.preset})`)));
  const cluster = h("input", { id: "search-cluster", list: "search-clusters", value: "h100-sxm-8x8",
    style: "width: 14rem" });
  const options = h("datalist", { id: "search-clusters" },
    clusters.map((c) => h("option", { value: c.name }, `${c.devices} devices`)));
  const gpus = numberInput("search-gpus", "all", { min: 1 });
  const batch = numberInput("search-batch", "the model's", { min: 1 });
  const headroom = numberInput("search-headroom", "0.1", { min: 0, max: 0.99, step: 0.05, value: 0.1 });
  const maxTp = numberInput("search-max-tp", "a node", { min: 1 });
  const fields = {
    model_id: field("model_id", model), cluster: field("cluster", cluster),
    gpus: field("gpus", gpus), global_batch: field("global_batch", batch),
    memory_headroom: field("memory_headroom", headroom), max_tp: field("max_tp", maxTp),
  };
  const banner = h("div", {});
  const submit = h("button", { type: "submit" }, "Search");
  const form = h("form", { class: "card", "aria-label": "search" },
    h("div", { style: "display: grid; grid-template-columns: max-content 1fr; gap: .35rem 1rem; "
      + "align-items: center" },
      row("Model", model, fields.model_id.line),
      row("Cluster", cluster, options, fields.cluster.line),
      row("GPUs", gpus, fields.gpus.line),
      row("Global batch (sequences)", batch, fields.global_batch.line),
      row("Memory headroom", headroom, fields.memory_headroom.line),
      row("Largest tp", maxTp, fields.max_tp.line)),
    banner, submit);
  if (!presets.length) {
    banner.replaceChildren(h("p", { class: "error" },
      "No model made from a preset yet: a search rebuilds the model for each mesh. ",
      h("a", { href: "#/models" }, "Create one on the Models page"), "."));
  }
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(fields, banner);
    const body = { model_id: Number(model.value), cluster: cluster.value.trim(),
      memory_headroom: Number(headroom.value || 0.1) };
    for (const [key, el] of [["gpus", gpus], ["global_batch", batch], ["max_tp", maxTp]]) {
      if (el.value !== "") body[key] = Number(el.value);
    }
    submit.disabled = true;
    try {
      await onSearch(body);
    } catch (err) {
      showError(err, fieldOf(err) ?? (err.detail?.gpus !== undefined ? "gpus" : null), fields,
        banner);
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

function hoverOf(c) {
  const lines = [`<b>${c.label}</b>`];
  if (c.step_time_s !== null) {
    lines.push(`step ${fmtTime(c.step_time_s)}, peak ${fmtBytes(c.peak_memory_bytes)} per rank`);
  }
  if (c.mfu !== null) lines.push(`MFU ${fmtPercent(c.mfu)}`);
  for (const twin of c.same_plan || []) lines.push(`same plan: ${twin.label}`);
  lines.push(c.fits ? "fits — click to build this plan" : `does not fit: ${c.reason}`);
  return lines.join("<br>");
}

/** The scatter: one trace per mesh shape that fits, one grey trace of those that do not, and
 * the Pareto front; `customdata` holds each point's candidate index. */
function figure(result) {
  const cs = result.candidates;
  const planned = cs.map((c, i) => ({ c, i })).filter(({ c }) => c.step_time_s !== null);
  const byMesh = new Map();
  for (const p of planned.filter(({ c }) => c.fits)) {
    if (!byMesh.has(p.c.mesh)) byMesh.set(p.c.mesh, []);
    byMesh.get(p.c.mesh).push(p);
  }
  const point = (pts, name, extra) => ({
    type: "scatter", mode: "markers", name,
    x: pts.map(({ c }) => c.peak_memory_bytes / GIB),
    y: pts.map(({ c }) => c.step_time_s * 1e3),
    customdata: pts.map(({ i }) => i),
    hovertext: pts.map(({ c }) => hoverOf(c)), hoverinfo: "text", ...extra,
  });
  const traces = [...byMesh.entries()].map(([mesh, pts]) => point(pts, mesh, { marker: { size: 10 } }));
  const out = planned.filter(({ c }) => !c.fits);
  if (out.length) traces.push(point(out, "does not fit", { marker: { size: 8, color: GREY, symbol: "x" } }));
  const front = result.pareto.map((i) => ({ c: cs[i], i }));
  traces.push({ ...point(front, "Pareto front", {}), mode: "lines", line: { color: "#333", dash: "dot" },
    hoverinfo: "skip" });
  return traces;
}

/** One line on screening (`search/screen.py`): how many, and how far off where checked. */
function screeningLine(result) {
  const s = result.screening;
  if (!s || !s.screened) return "";
  const pct = (x) => `${x >= 0 ? "+" : ""}${(100 * x).toFixed(2)}%`;
  const range = ([lo, hi]) => `${pct(lo)} to ${pct(hi)}`;
  return `${s.screened} candidates were screened on shallow copies of the model; the `
    + `${s.checked} then planned in full were ${range(s.step_error)} off in step time and `
    + `${range(s.memory_error)} in peak memory.`;
}

function whyBox(result) {
  return h("section", { "aria-label": "why this one" }, h("h2", {}, "Why this one"),
    h("pre", { id: "search-why" }, result.why.join("\n")));
}

/** Build the candidate ranked `index` as the search planned it (the model at the searched
 * global batch, its strategy, the search's cluster); resolves with the new plan's id. */
async function buildPlan(search, index) {
  const plan = await api(`/api/searches/${search.id}/plans`, { method: "POST",
    body: { candidate: index } });
  return plan.id;
}

function table(search, onBuild) {
  const rows = search.result.candidates.slice(0, 15).map((c, i) => h("tr", {},
    h("td", { class: "num" }, String(i + 1)),
    h("td", {}, c.label, ...(c.same_plan || []).map((twin) =>
      h("div", { class: "muted same-plan" }, `same plan: ${twin.label}`))),
    h("td", { class: "num" }, c.step_time_s === null ? "–" : fmtTime(c.step_time_s)),
    h("td", { class: "num" }, c.peak_memory_bytes === null ? "–" : fmtBytes(c.peak_memory_bytes)),
    h("td", { class: c.fits ? "status-succeeded" : "status-failed" }, c.fits ? "fits" : c.reason),
    h("td", {}, c.fits ? h("button", { type: "button", class: "secondary",
      onclick: () => onBuild(i) }, "Build this plan") : "")));
  return h("table", { "aria-label": "ranked candidates" },
    h("thead", {}, h("tr", {}, ["#", "Candidate", "Step", "Peak memory", "Fits", ""]
      .map((t) => h("th", {}, t)))), h("tbody", {}, rows));
}

async function showResult(out, search) {
  const result = search.result;
  const fits = result.candidates.filter((c) => c.fits).length;
  const build = async (index) => {
    const candidate = result.candidates[index];
    out.querySelector("#search-building")?.remove();
    out.append(h("p", { id: "search-building", class: "loading" }, `building ${candidate.label}…`));
    try {
      const id = await buildPlan(search, index);
      window.location.hash = `#/plans/${id}`;
    } catch (err) {
      out.append(errorBox(err));
    }
  };
  const plot = h("div", { id: "search-plot", role: "img",
    "aria-label": `${result.candidates.length} candidates, step time against peak memory` });
  out.replaceChildren(
    h("p", { id: "search-summary" }, `${result.planned ?? result.candidates.length} candidates `
      + `planned in ${result.seconds.toFixed(1)} s on ${result.gpus} GPUs of ${result.cluster} `
      + `(${result.candidates.length} distinct plans): ${fits} fit; `
      + `${result.pruned.length} meshes pruned.`),
    h("p", { id: "search-screening" }, screeningLine(result)),
    plot, whyBox(result), table(search, build),
    h("details", {}, h("summary", {}, `Pruned meshes (${result.pruned.length})`),
      h("ul", {}, result.pruned.map((p) => h("li", {}, `${p.candidate}: ${p.reason}`)))),
    h("details", {}, h("summary", {},
      `Skipped by their bounds or screening (${(result.skipped || []).length})`),
      h("ul", {}, (result.skipped || []).map((p) => h("li", {}, `${p.candidate}: ${p.reason}`)))));
  const Plotly = await plotly();
  await Plotly.react(plot, figure(result), {
    height: 460, margin: { l: 70, r: 20, t: 20, b: 50 },
    xaxis: { title: { text: "peak memory per rank (GiB)" } },
    yaxis: { title: { text: "step time (ms)" } },
    legend: { orientation: "h", y: -0.2 },
  }, { responsive: true, displaylogo: false });
  plot.on("plotly_click", (ev) => {
    const i = ev.points?.[0]?.customdata;
    if (i !== undefined && result.candidates[i].fits) build(i);
  });
}

export async function render(root, ctx) {
  root.append(h("h1", {}, "Find a strategy"), h("p", { class: "muted" },
    "Every mesh of the cluster's GPUs, data-parallel and tensor-parallel recipes, "
    + "recomputation and pipeline schedules, planned and costed; the leaner recipes are tried "
    + "where memory runs short."));
  const out = h("div", { id: "search-result" });
  let models;
  let clusters;
  try {
    [models, clusters] = await Promise.all([api("/api/models?limit=1000"), api("/api/clusters")]);
  } catch (err) {
    root.append(errorBox(err));
    return;
  }
  const progress = h("progress", { max: 1, value: 0, "aria-label": "search progress" });
  const message = h("span", {});
  const status = h("p", { hidden: true }, progress, " ", message);
  const follow = async (id) => {
    ctx.setQuery({ id });
    let search = await api(`/api/searches/${id}`);
    if (["queued", "running"].includes(search.status)) {
      status.hidden = false;
      const job = await followJob(search.job_id, (j) => {
        progress.value = j.progress ?? 0;
        message.textContent = j.message || j.status;
      }, ctx.signal);
      if (!job || ctx.signal.aborted) return;
      search = await api(`/api/searches/${id}`);
    }
    status.hidden = true;
    if (search.status !== "succeeded") {
      out.replaceChildren(h("p", { class: "error", role: "alert" },
        `search ${id} ${search.status}: ${search.error?.message ?? search.message}`));
      return;
    }
    await showResult(out, search);
  };
  const form = searchForm(models, clusters, async (body) => {
    const created = await api("/api/searches", { method: "POST", body });
    out.replaceChildren();
    follow(created.id).catch((err) => out.replaceChildren(errorBox(err)));
  });
  root.append(form, status, out);
  const id = ctx.query.get("id");
  if (id) follow(id).catch((err) => out.replaceChildren(errorBox(err)));
}
