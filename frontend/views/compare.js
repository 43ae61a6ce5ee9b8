// Compare two built plans (B against A, deltas B - A): headline figures, memory, collectives,
// time per layer scope (Plotly), the ops that changed most, and the placements that differ.
import { api, ApiError, followJob } from "../api.js";
import { clearErrors, field, fieldOf, labelled, showError } from "../forms.js";
import { errorBox, fmtBytes, fmtInt, fmtPercent, fmtTime, h, plotly } from "../ui.js";

const FAILED = ["failed", "cancelled", "timed_out"];
const PLACEMENT_LIMIT = 200;
const NOWRAP = "white-space: nowrap";

// -- figures: unit and which direction is better --------------------------------------------

/** A difference of fractions in percentage points: 0.0123 -> "1.2 pp", 0.00031 -> "0.031 pp". */
function pp(d) {
  const points = d * 100;
  return `${Math.abs(points) >= 0.1 ? points.toFixed(1) : points.toPrecision(2)} pp`;
}

/** How a figure named `name` is shown, and whether more of it is better (null: neither). */
export function kindOf(name) {
  if (name === "MFU") return { fmt: fmtPercent, delta: pp, higher: true };
  if (name === "tokens/s") return { fmt: (v) => fmtInt(Math.round(v)), higher: true };
  if (/\(s\)$/.test(name)) return { fmt: fmtTime, higher: false };
  if (/bytes/.test(name) || name === "peak" || name.startsWith("at peak")) return { fmt: fmtBytes, higher: false };
  if (/count$/.test(name)) return { fmt: fmtInt, higher: false };
  return { fmt: fmtInt, higher: null };
}

function signed(text, d) {
  return d > 0 && !text.startsWith("+") ? `+${text}` : text.replace(/^-/, "−");
}

/** "better" / "worse" / "same" / "–" for B against A. */
function verdict(row, higher) {
  if (row.delta === 0) return "same";
  if (higher === null) return "–";
  return (row.delta > 0) === higher ? "better" : "worse";
}

function deltaTable(label, rows) {
  const body = rows.map((row) => {
    const k = kindOf(row.name);
    const word = verdict(row, k.higher);
    const delta = row.delta === 0 ? "0" : signed((k.delta ?? k.fmt)(row.delta), row.delta);
    return h("tr", { dataset: { name: row.name } },
      h("th", { scope: "row" }, row.name.replace(/ \(s\)$/, "")),
      h("td", { class: "num", style: NOWRAP, dataset: { col: "a" } }, k.fmt(row.a)),
      h("td", { class: "num", style: NOWRAP, dataset: { col: "b" } }, k.fmt(row.b)),
      h("td", { class: "num", style: NOWRAP, dataset: { col: "delta" } }, delta),
      h("td", { class: "num", style: NOWRAP }, row.ratio === null || row.ratio === undefined ? "–" : `×${row.ratio.toFixed(3)}`),
      h("td", { style: NOWRAP, class: word === "better" ? "delta-better" : word === "worse" ? "delta-worse" : "muted" },
        ["better", "worse"].includes(word) ? `${row.delta > 0 ? "▲" : "▼"} ${word}` : word));
  });
  return h("table", { "aria-label": label },
    h("thead", {}, h("tr", {}, ["", "A", "B", "Δ (B − A)", "B / A", "B vs A"].map((t, i) =>
      h("th", { scope: "col", class: i && i < 5 ? "num" : null }, t)))),
    h("tbody", {}, body));
}

// -- per-scope time deltas ------------------------------------------------------------------

const byScope = (a, b) => a.localeCompare(b, "en", { numeric: true });

/** `scopes` rows ("layers.3 compute") -> {scopes: [...], compute: Map, comm: Map}. */
function splitScopes(rows) {
  const out = { compute: new Map(), comm: new Map() };
  for (const row of rows) {
    const at = row.name.lastIndexOf(" ");
    const scope = row.name.slice(0, at);
    const kind = row.name.slice(at + 1) === "comm" ? "comm" : "compute";
    out[kind].set(scope, row);
  }
  out.scopes = [...new Set([...out.compute.keys(), ...out.comm.keys()])].sort(byScope);
  return out;
}

async function scopeChart(el, rows) {
  const Plotly = await plotly();
  const split = splitScopes(rows);
  const largest = Math.max(...rows.map((r) => Math.abs(r.delta)));
  const [scale, unit] = largest >= 1 ? [1, "s"] : largest >= 1e-3 ? [1e3, "ms"] : [1e6, "µs"];
  const trace = (kind, color) => ({
    type: "bar", orientation: "h", name: `${kind} Δ`, marker: { color },
    y: split.scopes, x: split.scopes.map((s) => (split[kind].get(s)?.delta ?? 0) * scale),
    customdata: split.scopes.map((s) => {
      const r = split[kind].get(s) ?? { a: 0, b: 0, delta: 0 };
      const word = r.delta < 0 ? "faster in B" : r.delta > 0 ? "slower in B" : "unchanged";
      return `${fmtTime(r.a)} → ${fmtTime(r.b)} (${word})`;
    }),
    hovertemplate: `%{y} ${kind}: %{customdata}<extra></extra>`,
  });
  const height = Math.max(220, 60 + split.scopes.length * 22);
  await Plotly.newPlot(el, [trace("compute", "#4c78a8"), trace("comm", "#e45756")], {
    barmode: "group", height, margin: { l: 120, r: 20, t: 30, b: 50 },
    xaxis: { title: { text: `Δ time per step, ${unit} (B − A): < 0 faster in B, > 0 slower` },
      zeroline: true },
    yaxis: { autorange: "reversed", automargin: true },
    legend: { orientation: "h", x: 0, y: 1, yanchor: "bottom" },
  }, { displaylogo: false, responsive: true });
}

/** Text of the chart: the layer scopes that got faster or slower (compute + comm). */
function scopeSummary(rows) {
  const split = splitScopes(rows);
  const total = split.scopes.map((s) => ({ s,
    d: (split.compute.get(s)?.delta ?? 0) + (split.comm.get(s)?.delta ?? 0) }));
  const list = (items) => items.slice(0, 8).map((x) => `${x.s} (${signed(fmtTime(x.d), x.d)})`).join(", ") || "none";
  // changes a thousand times smaller than the largest one count as unchanged
  const epsilon = Math.max(0, ...total.map((x) => Math.abs(x.d))) * 1e-3;
  const faster = total.filter((x) => x.d < -epsilon).sort((x, y) => x.d - y.d);
  const slower = total.filter((x) => x.d > epsilon).sort((x, y) => y.d - x.d);
  return h("div", {},
    h("p", {}, h("strong", {}, "Faster in B: "), list(faster)),
    h("p", {}, h("strong", {}, "Slower in B: "), list(slower)),
    h("details", {}, h("summary", {}, "Table of per-scope times"),
      deltaTable("time per scope", rows.map((r) => ({ ...r, name: `${r.name} (s)` })))));
}

// -- placements -----------------------------------------------------------------------------

function placementsList(rows, planB) {
  const filter = h("input", { type: "search", placeholder: "filter values", size: 30 });
  const body = h("tbody");
  const note = h("p", { class: "muted", "aria-live": "polite" });
  function fill() {
    const needle = filter.value.trim();
    const shown = rows.filter((r) => !needle || r.value.includes(needle));
    body.replaceChildren(...shown.slice(0, PLACEMENT_LIMIT).map((r) => {
      const q = `value=${encodeURIComponent(r.value)}`;
      return h("tr", { dataset: { value: r.value } },
        h("td", {}, h("code", {}, r.value)),
        h("td", {}, h("code", {}, r.a)),
        h("td", {}, h("code", {}, r.b)),
        h("td", {},
          h("a", { href: `#/plans/${planB}/graph?${q}`, "aria-label": `${r.value} in the graph of plan B` }, "graph"),
          " · ",
          h("a", { href: `#/plans/${planB}/sharding?${q}`, "aria-label": `sharding of ${r.value} in plan B` }, "sharding")));
    }));
    note.textContent = shown.length > PLACEMENT_LIMIT
      ? `showing ${PLACEMENT_LIMIT} of ${shown.length}; filter to see others` : `${shown.length} shown`;
  }
  filter.addEventListener("input", fill);
  fill();
  return h("div", {},
    labelled("Filter values", filter),
    h("table", { "aria-label": "placements that differ" },
      h("thead", {}, h("tr", {}, ["Value", "A", "B", "Plan B views"].map((t) => h("th", { scope: "col" }, t)))),
      body),
    note);
}

// -- the view -------------------------------------------------------------------------------

/** The name of a strategy auto-named with a time stamp by older forms
 * ("dp=8 dp @ 2026-11-27 09:12:03.456"). */
const STAMPED = / @ \d{4}-\d\d-\d\d[ T][\d:.]+Z?$/;

/** A strategy as people read it: its name, or for a stamped auto-name its mesh and
 * templates ("dp=8,tp=8 dp+megatron_tp"); the version only past the first. */
export function strategyText(s) {
  const name = STAMPED.test(s.name)
    ? [s.mesh, (s.templates ?? []).join("+")].filter(Boolean).join(" ") : s.name;
  return s.version > 1 ? `${name} v${s.version}` : name;
}

function planText(plan, names) {
  const cost = plan.summary?.cost;
  return `#${plan.id} ${names.model.get(plan.model_id) ?? `model ${plan.model_id}`} · `
    + `${names.strategy.get(plan.strategy_id) ?? plan.summary?.mesh ?? ""}`
    + `${plan.cluster ? ` · ${plan.cluster}` : ""}${cost ? ` · ${fmtTime(cost.step_time_s)}` : ""}`;
}

const GRID = "display: grid; grid-template-columns: repeat(auto-fit, minmax(34rem, 1fr)); "
  + "gap: 0 1.2rem; align-items: start";

/** The contents of a comparison: links to its sections (the page runs long). The links
 * scroll (the URL's hash is the router's, so they do not navigate). */
function contents(out) {
  const links = [...out.querySelectorAll("section[id^='cmp-']")].map((section) => {
    const title = section.querySelector("h2").textContent;
    return h("li", {}, h("a", { href: `#${section.id}`, dataset: { section: section.id },
      onclick: (e) => {
        e.preventDefault();
        section.scrollIntoView({ block: "start" });
        section.querySelector("h2").focus({ preventScroll: true });
      } }, title.replace(/ \(\d[\d,]*\)$/, "")));
  });
  return h("nav", { class: "cmp-toc", "aria-label": "comparison contents" },
    h("strong", {}, "Contents: "), h("ul", {}, links));
}

function showResult(out, c, planB) {
  const step = c.headline.find((r) => r.name === "step time (s)");
  const slug = (title) => `cmp-${title.toLowerCase().replace(/[^a-z]+/g, "-").replace(/-+$/, "")}`;
  const card = (title, ...body) => {
    const id = slug(title.replace(/ \(.*$/, ""));
    return h("section", { class: "card", id, "aria-labelledby": `${id}-title` },
      h("h2", { id: `${id}-title`, tabindex: -1 }, title), ...body);
  };
  const grid = h("div", { style: GRID },
    card("Headline", deltaTable("headline", c.headline)),
    c.scopes.length ? card("Time per layer scope") : null,
    c.memory.length ? card("Memory per rank", deltaTable("memory", c.memory)) : null,
    c.collectives.length ? card("Collectives per rank", deltaTable("collectives", c.collectives)) : null);
  out.replaceChildren(
    h("p", {}, h("strong", {}, "A: "), c.a, h("br"), h("strong", {}, "B: "), c.b),
    step ? h("p", {}, `Step time ${fmtTime(step.a)} → ${fmtTime(step.b)}: B is `,
      step.delta < 0 ? h("span", { class: "delta-better" }, `faster (×${step.ratio?.toFixed(3)})`)
        : step.delta > 0 ? h("span", { class: "delta-worse" }, `slower (×${step.ratio?.toFixed(3)})`)
          : "as fast") : h("p", { class: "muted" }, "Not costed: plan both on a cluster for times."),
    grid);
  if (c.scopes.length) {
    const chart = h("div", { id: "scope-chart", role: "img",
      "aria-label": "time per layer scope, B minus A, compute and comm bars" });
    grid.children[1].append(chart, scopeSummary(c.scopes));
    scopeChart(chart, c.scopes).catch((err) => chart.replaceChildren(errorBox(err)));
  }
  if (c.ops.length) {
    out.append(card("Ops that changed most",
      deltaTable("ops", c.ops.map((r) => ({ ...r, name: `${r.name} (s)` })))));
  }
  out.append(card(`Placements that differ (${fmtInt(c.placements.length)})`,
    c.placements.length ? placementsList(c.placements, planB)
      : h("p", { class: "muted" }, "Every value shared by both plans has the same placement.")));
  out.prepend(contents(out));
}

export async function render(root, ctx) {
  const [plans, models, strategies] = await Promise.all([
    api("/api/plans?limit=1000"), api("/api/models?limit=1000"),
    api("/api/strategies?all_versions=true&limit=1000")]);
  const names = {
    model: new Map(models.map((m) => [m.id, m.name])),
    strategy: new Map(strategies.map((s) => [s.id, strategyText(s)])),
  };
  const built = plans.filter((p) => p.status === "succeeded");
  root.append(h("h1", {}, "Compare plans"));
  if (built.length < 2) {
    root.append(h("p", {}, "Comparing needs two built plans: ", h("a", { href: "#/plans/new" }, "plan"),
      ` another one (${built.length} built so far).`));
    return;
  }
  const select = (which) => h("select", { name: which },
    h("option", { value: "" }, "choose a plan"),
    built.map((p) => h("option", { value: p.id }, planText(p, names))));
  const planA = select("a");
  const planB = select("b");
  const fields = { plan_a_id: field("plan-a", planA), plan_b_id: field("plan-b", planB) };
  const banner = h("div");
  const run = h("button", { type: "submit" }, "Compare");
  const progress = h("progress", { max: 1, value: 0, "aria-label": "comparison progress" });
  const message = h("span", { role: "status" });
  const job = h("p", { hidden: true }, progress, " ", message);
  const out = h("section", { "aria-label": "comparison" });
  const want = (id) => (built.some((p) => String(p.id) === id) ? id : "");
  planA.value = want(ctx.query.get("a") ?? "");
  planB.value = want(ctx.query.get("b") ?? "");
  for (const [key, el] of [["a", planA], ["b", planB]]) {
    const asked = ctx.query.get(key);
    if (asked && !el.value) {
      const plan = plans.find((p) => String(p.id) === asked);
      fields[`plan_${key}_id`].show(plan ? `plan ${asked} is ${plan.status}, not built: it cannot be compared yet`
        : `plan ${asked} not found`);
    }
  }

  async function compare() {
    clearErrors(fields, banner);
    out.replaceChildren();
    const a = Number(planA.value);
    const b = Number(planB.value);
    if (!a || !b) {
      if (!a) fields.plan_a_id.show("choose plan A");
      if (!b) fields.plan_b_id.show("choose plan B");
      return;
    }
    ctx.setQuery({ a, b });
    run.disabled = true;
    try {
      const existing = (await api("/api/comparisons")).find((c) => c.plan_a_id === a
        && c.plan_b_id === b && !FAILED.includes(c.status));
      const comp = existing ?? await api("/api/comparisons",
        { method: "POST", body: { plan_a_id: a, plan_b_id: b } });
      if (comp.status !== "succeeded") {
        job.hidden = false;
        const show = (j) => {
          progress.value = j.progress ?? 0;
          message.textContent = `${j.status}${j.message ? `: ${j.message}` : ""}`;
        };
        show({ status: comp.status, progress: 0, message: "" });
        const final = await followJob(comp.job_id, show, ctx.signal);
        if (!final) return;
        show(final);
        if (final.status !== "succeeded") {
          banner.replaceChildren(errorBox(final.error ? new ApiError(422, final.error)
            : new Error(`the comparison job ended ${final.status}`)));
          return;
        }
      }
      const result = comp.result ?? (await api(`/api/comparisons/${comp.id}`)).result;
      job.hidden = true;
      showResult(out, result.comparison ?? result, b); // the stored result is Comparison.to_json()
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      showError(err, fieldOf(err), fields, banner);
    } finally {
      run.disabled = false;
    }
  }

  const form = h("form", { class: "card", novalidate: true, "aria-label": "plans to compare",
    onsubmit: (e) => { e.preventDefault(); compare(); } },
  h("div", { style: "display: flex; gap: 1.5rem; flex-wrap: wrap; align-items: flex-end" },
    h("div", {}, labelled("Plan A (baseline)", planA, fields.plan_a_id.line)),
    h("div", {}, labelled("Plan B (compared with A)", planB, fields.plan_b_id.line)),
    h("div", {}, run)),
  banner, job);
  root.append(form, out);
  if (planA.value && planB.value) await compare();
}
