// The sharding diagram: which block of a value every rank of the mesh holds.
//
// One cell per rank, laid out on the mesh: a row for a 1-D mesh, a grid (first axis down,
// second across) for 2-D, one grid panel per index of the further axes ("sp=0", "sp=1") for
// 3-D and up. Each cell outlines the value's global tensor (two of its dims: the sharded ones
// first) and fills the block the rank holds, coloured by block, so replicas (same block on
// several ranks: "R" marker) show the same colour; partial values (Partial placements: the
// block must be reduced over the rank's partial group) are hatched with a "P(op)" marker.
// Hovering, focusing or clicking a cell shows the rank's local shape and index ranges in the
// side box. The rank label and the markers have slots of their own, measured so they never
// overlap; a mesh of more than 16 ranks offers a compact mode, a heat map of the block index
// by rank (sharding_heat.js). URL state: `value`, `rank`, `compact`.
import { api } from "../api.js";
import { s, textWidth } from "../svg.js";
import { errorBox, fmtInt, h, planTabs } from "../ui.js";
import { heatGrid, heatLegend } from "./sharding_heat.js";

const LABEL_FONT = "12px system-ui, sans-serif";
const MARKER_FONT = "600 11px system-ui, sans-serif";
/** Meshes of more ranks than this offer the compact heat map. */
const COMPACT_OVER = 16;
const PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2",
  "#eeca3b", "#9d755d", "#ff9da6", "#bab0ac"];

const STYLE = `
.sh-controls { display: flex; gap: 1rem; align-items: end; flex-wrap: wrap; }
.sh-controls input { width: 30rem; max-width: 100%; }
.sh-facts { margin: .6rem 0; }
.sh-facts code { background: #eef1f8; padding: 0 .25rem; border-radius: 3px; }
.sh-layout { display: grid; grid-template-columns: minmax(0, 1fr) 22rem; gap: 1rem;
  align-items: start; }
.sh-panels { display: flex; flex-wrap: wrap; gap: 1rem; }
.sh-panel { margin: 0; background: var(--card, #fff); border: 1px solid var(--line, #dde);
  border-radius: 6px; padding: .5rem; }
.sh-panel figcaption { font-weight: 600; margin-bottom: .3rem; }
.sh-cell { cursor: pointer; }
.sh-cell:focus { outline: none; }
.sh-cell .sh-frame { fill: #fff; stroke: #b9c0cf; stroke-width: 1; }
.sh-cell:hover .sh-frame { stroke: #5b6475; }
.sh-cell.sh-peer .sh-frame { stroke: #5b6475; stroke-dasharray: 4 3; stroke-width: 1.5; }
.sh-cell.sh-selected .sh-frame { stroke: #1d2330; stroke-width: 3; stroke-dasharray: none; }
.sh-cell:focus-visible .sh-frame { stroke: #f0a020; stroke-width: 3; }
.sh-outline { fill: #f3f4f8; stroke: #5b6475; stroke-width: 1; }
.sh-block { stroke: #1d2330; stroke-width: .8; }
.sh-marker { font: 600 11px system-ui, sans-serif; }
.sh-label { font: 12px system-ui, sans-serif; fill: #1d2330; }
.sh-heat { stroke: #fff; stroke-width: 1; }
.sh-heat-cell[data-kind=partial] .sh-heat { stroke: #b3261e; stroke-width: 2; }
.sh-heat-cell:hover .sh-heat, .sh-heat-cell.sh-peer .sh-heat { stroke: #1d2330; stroke-width: 2; }
.sh-heat-cell.sh-selected .sh-heat { stroke: #f0a020; stroke-width: 3; }
.sh-heat-cell:focus-visible .sh-heat { stroke: #f0a020; stroke-width: 3; }
.sh-heat-text { font: 600 11px system-ui, sans-serif; pointer-events: none; }
.sh-heat-scale { display: inline-block; width: 8rem; height: .8rem; vertical-align: middle;
  border: 1px solid #b9c0cf; }
.sh-axis { font: 600 12px system-ui, sans-serif; fill: #2f5fd0; }
.sh-legend { display: flex; flex-wrap: wrap; gap: .4rem 1.4rem; margin: .6rem 0;
  list-style: none; padding: 0; }
.sh-legend li { display: flex; gap: .4rem; align-items: center; }
#rank-detail dl { display: grid; grid-template-columns: auto 1fr; gap: .2rem .8rem; margin: 0; }
#rank-detail dt { color: var(--muted, #5b6475); }
#rank-detail dd { margin: 0; }
#rank-detail table { margin-top: .4rem; }
`;

const fmtShape = (shape) => (shape.length ? shape.map(fmtInt).join(" × ") : "scalar");
const fmtRange = ([start, stop]) => `[${fmtInt(start)}, ${fmtInt(stop)})`;
const fmtRanks = (ranks) => ranks.join(", ");
const partialText = (partial) => partial.map((p) => `P(${p.op})`).join(" ");

/** Coordinates as "dp=0, tp=1". */
function coordText(mesh, coord) {
  return mesh.axes.map((a, k) => `${a.name}=${coord[k]}`).join(", ");
}

/** The two tensor dims a cell draws: sharded dims first, then the first others; ascending
 * (rows = the first, columns = the second). One dim for a vector, none for a scalar. */
function drawnDims(blocks) {
  const sharded = blocks.dims.filter((d) => d.axes.length).map((d) => d.dim);
  const picked = sharded.slice(0, 2);
  for (const d of blocks.dims) {
    if (picked.length >= Math.min(2, blocks.dims.length)) break;
    if (!picked.includes(d.dim)) picked.push(d.dim);
  }
  return picked.sort((a, b) => a - b);
}

/** Per rank: the index (colour) of the block it holds; blocks numbered as first met. */
function blockColours(blocks) {
  const index = new Map();
  const out = new Map();
  for (const r of blocks.ranks) {
    const key = JSON.stringify(r.ranges);
    if (!index.has(key)) index.set(key, index.size);
    out.set(r.rank, index.get(key));
  }
  return out;
}

/** The hatch patterns of partial blocks, one per colour: defined once per page. */
function hatchPatterns() {
  return s("svg", { width: 0, height: 0, "aria-hidden": "true", style: "position: absolute" },
    s("defs", {}, PALETTE.map((colour, i) =>
    s("pattern", { id: `sh-hatch-${i}`, patternUnits: "userSpaceOnUse", width: 7, height: 7,
      patternTransform: "rotate(45)" },
    s("rect", { width: 7, height: 7, fill: "#fff" }),
    s("rect", { width: 3.5, height: 7, fill: colour })))));
}

/** A rank's markers: "P(sum)" for a partial value, "R" for a replicated block. */
function markerText(r) {
  return [r.partial.length ? partialText(r.partial) : null, r.replica_group.length > 1 ? "R" : null]
    .filter(Boolean).join(" ");
}

/** A rank's block in words (its cell's accessible name and tooltip). */
function rankText(blocks, r) {
  return `rank ${r.rank} (${coordText(blocks.mesh, r.coord)}): local shape `
    + `${fmtShape(r.local_shape)}, ${r.ranges.map((rg, d) => `dim ${d} ${fmtRange(rg)}`).join(", ")}`
    + `${r.partial.length ? `, partial ${partialText(r.partial)} over ${r.partial.map((p) => p.axis).join(", ")}` : ""}`
    + `${r.replica_group.length > 1 ? `, replicated on ranks ${fmtRanks(r.replica_group)}` : ""}`;
}

/** Whether the markers of cells `size` wide need a row of their own under the rank labels:
 * when a label and its markers, as measured, do not fit side by side in some cell. */
function markersBelow(blocks, size) {
  const room = size - 16;
  return blocks.ranks.some((r) => {
    const marker = markerText(r);
    return marker && textWidth(`rank ${r.rank}`, LABEL_FONT) + 8
      + textWidth(marker, MARKER_FONT) > room;
  });
}

/** A text's attributes squeezing it into `room` pixels when wider (measured). */
function squeeze(text, font, room) {
  return textWidth(text, font) > room ? { textLength: room, lengthAdjust: "spacingAndGlyphs" } : {};
}

/** The cell of one rank: frame, label, the tensor outline, its block, and the markers
 * (beside the label, or in a row of their own under it when `below`). */
function rankCell(blocks, r, size, colour, dims, x, y, below) {
  const partial = r.partial.length > 0;
  const replicated = r.replica_group.length > 1;
  const fill = partial ? `url(#sh-hatch-${colour % PALETTE.length})` : PALETTE[colour % PALETTE.length];
  // the tensor outline: two dims, aspect ratio kept within 1:3 .. 3:1
  const pad = 10;
  const top = below ? 34 : 22;
  const areaW = size - 2 * pad;
  const areaH = size - top - pad;
  const sizes = dims.map((d) => Math.max(1, blocks.shape[d])); // an empty dim: draw it anyway
  const rowsN = dims.length === 2 ? sizes[0] : 1;
  const colsN = dims.length ? sizes[dims.length - 1] : 1;
  const aspect = Math.min(3, Math.max(1 / 3, rowsN / colsN));
  let w = areaW;
  let hgt = Math.min(areaH, w * aspect);
  if (hgt / aspect < w) w = hgt / aspect;
  if (dims.length === 1) hgt = Math.min(areaH, Math.max(14, areaH / 4));
  if (!dims.length) { w = areaW / 2; hgt = areaH / 2; }
  const ox = pad + (areaW - w) / 2;
  const oy = top + (areaH - hgt) / 2;
  const span = (d, n, len) => {
    if (d === undefined) return [0, len];
    const [a, b] = r.ranges[d];
    return [(len * a) / n, (len * (b - a)) / n];
  };
  const [bx, bw] = dims.length ? span(dims[dims.length - 1], colsN, w) : [0, w];
  const [by, bh] = dims.length === 2 ? span(dims[0], rowsN, hgt) : [0, hgt];
  const marker = markerText(r);
  const label = rankText(blocks, r);
  const room = size - 16;
  return s("g", {
    class: "sh-cell", tabindex: 0, role: "button", "aria-label": label,
    "data-rank": r.rank, "data-kind": partial ? "partial" : replicated ? "replicate" : "shard",
    transform: `translate(${x},${y})`,
  },
  s("title", {}, label),
  s("rect", { class: "sh-frame", width: size - 4, height: size - 4, x: 2, y: 2, rx: 4 }),
  s("text", { class: "sh-label", x: 8, y: 16, ...squeeze(`rank ${r.rank}`, LABEL_FONT, room) },
    `rank ${r.rank}`),
  marker ? s("text", { class: "sh-marker", x: size - 8, y: below ? 29 : 16, "text-anchor": "end",
    fill: partial ? "#b3261e" : "#2e7d32", "data-marker": marker,
    ...squeeze(marker, MARKER_FONT, room) }, marker) : null,
  s("rect", { class: "sh-outline", x: ox, y: oy, width: w, height: hgt }),
  s("rect", { class: "sh-block", x: ox + bx, y: oy + by, width: Math.max(bw, 1),
    height: Math.max(bh, 1), fill }));
}

/** One grid of cells: `rowsAxis` down (or none), `colsAxis` across; `fixed` pins the rest. */
function gridSvg(blocks, byCoord, colours, dims, rowsAxis, colsAxis, fixed, size, below) {
  const mesh = blocks.mesh;
  const axes = mesh.axes;
  const nRows = rowsAxis === null ? 1 : axes[rowsAxis].size;
  const nCols = axes[colsAxis].size;
  const left = rowsAxis === null ? 8 : 64;
  const top = 40;
  const width = left + nCols * size + 8;
  const height = top + nRows * size + 8;
  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "group",
    "aria-label": `ranks by ${[rowsAxis, colsAxis].filter((k) => k !== null)
      .map((k) => axes[k].name).join(" × ")}` });
  svg.append(s("text", { class: "sh-axis", x: left + (nCols * size) / 2, y: 14,
    "text-anchor": "middle", "data-axis": axes[colsAxis].name }, `${axes[colsAxis].name} →`));
  for (let c = 0; c < nCols; c += 1) {
    svg.append(s("text", { class: "sh-label", x: left + c * size + size / 2, y: 32,
      "text-anchor": "middle" }, `${axes[colsAxis].name}=${c}`));
  }
  if (rowsAxis !== null) {
    svg.append(s("text", { class: "sh-axis", x: 30, y: 32, "data-axis": axes[rowsAxis].name },
      `${axes[rowsAxis].name} ↓`));
    for (let rr = 0; rr < nRows; rr += 1) {
      svg.append(s("text", { class: "sh-label", x: 30, y: top + rr * size + size / 2 + 4 },
        `${axes[rowsAxis].name}=${rr}`));
    }
  }
  for (let rr = 0; rr < nRows; rr += 1) {
    for (let c = 0; c < nCols; c += 1) {
      const coord = [...fixed];
      if (rowsAxis !== null) coord[rowsAxis] = rr;
      coord[colsAxis] = c;
      const r = byCoord.get(coord.join(","));
      svg.append(rankCell(blocks, r, size, colours.get(r.rank), dims, left + c * size,
        top + rr * size, below));
    }
  }
  return svg;
}

/** Every combination of the indices of `axes` (row-major). */
function product(sizes) {
  return sizes.reduce((acc, n) => acc.flatMap((p) => Array.from({ length: n }, (_, i) => [...p, i])),
    [[]]);
}

/** The diagram: one panel (figure) per index of the axes beyond the first two; `compact`:
 * heat maps of the block index instead of the cells. */
function diagram(blocks, compact = false) {
  const axes = blocks.mesh.axes;
  const byCoord = new Map(blocks.ranks.map((r) => [r.coord.join(","), r]));
  const colours = blockColours(blocks);
  const dims = drawnDims(blocks);
  const perPanel = axes.length === 1 ? axes[0].size : axes[0].size * axes[1].size;
  const size = perPanel > 32 ? 64 : perPanel > 8 ? 96 : 140;
  const below = markersBelow(blocks, size);
  const grid = (rowsAxis, colsAxis, fixed) => (compact
    ? heatGrid(blocks, byCoord, colours, rowsAxis, colsAxis, fixed, (r) => rankText(blocks, r))
    : gridSvg(blocks, byCoord, colours, dims, rowsAxis, colsAxis, fixed, size, below));
  const panels = h("div", { class: "sh-panels" });
  if (axes.length === 1) {
    panels.append(h("figure", { class: "sh-panel", "aria-label": blocks.mesh.text },
      h("figcaption", {}, blocks.mesh.text), grid(null, 0, [0])));
    return panels;
  }
  const extra = axes.slice(2);
  for (const rest of product(extra.map((a) => a.size))) {
    const title = rest.length
      ? extra.map((a, i) => `${a.name}=${rest[i]}`).join(", ") : blocks.mesh.text;
    panels.append(h("figure", { class: "sh-panel", "aria-label": title },
      h("figcaption", {}, title), grid(0, 1, [0, 0, ...rest])));
  }
  return panels;
}

function swatch(fill, text = null) {
  return s("svg", { width: 34, height: 18, "aria-hidden": "true" },
    s("rect", { x: 1, y: 1, width: 20, height: 16, fill, stroke: "#1d2330", "stroke-width": 0.8 }),
    text ? s("text", { class: "sh-marker", x: 24, y: 13, fill: "#2e7d32" }, text) : null);
}

function legend() {
  return h("ul", { class: "sh-legend", "aria-label": "legend" },
    h("li", {}, swatch(PALETTE[0]), swatch(PALETTE[1]),
      "the block a rank holds, inside the outline of the whole tensor; one colour per distinct block"),
    h("li", {}, h("strong", { class: "status-succeeded" }, "R"),
      "replicated: the same block (same colour) is held whole by every rank of its replica group"),
    h("li", {}, swatch("url(#sh-hatch-0)"), h("strong", { class: "status-failed" }, "P(sum)"),
      "partial: the rank holds a partial value; summing (the op) over its partial group gives the block"),
    h("li", {}, "dashed frame: ranks that share the selected rank's block (replicas or partial group)"));
}

/** What the value is and how each mesh axis places it. */
function facts(blocks) {
  const dims = drawnDims(blocks);
  const how = blocks.placements.map((p) => {
    if (p.kind === "shard") {
      const size = blocks.mesh.axes.find((a) => a.name === p.axis).size;
      return `${p.axis}: ${p.placement} — dim ${p.dim} split in ${size}`;
    }
    if (p.kind === "partial") return `${p.axis}: ${p.placement} — partial ${p.op} over ${p.axis}`;
    return `${p.axis}: R — replicated over ${p.axis}`;
  });
  const hidden = blocks.dims.filter((d) => d.axes.length && !dims.includes(d.dim));
  return h("div", { class: "sh-facts" },
    h("p", {}, h("code", {}, blocks.value), ` ${blocks.kind} · ${blocks.dtype}[`,
      blocks.shape.join(", "), "] · spec ", h("code", { "data-field": "spec" }, blocks.spec),
      ` on ${blocks.mesh.text} · local shape ${fmtShape(blocks.local_shape)}`,
      blocks.even === false
        ? h("span", { "data-field": "uneven" }, " (the largest: a split dim does not divide its"
          + " mesh axes, so the last blocks are short or empty, as DTensor cuts them; each"
          + " rank's own shape is in its cell)")
        : ""),
    h("p", { class: "muted" }, how.join(" · ")),
    h("p", { class: "muted" }, dims.length === 2
      ? `Each cell outlines the whole tensor: rows = dim ${dims[0]} (${fmtInt(blocks.shape[dims[0]])}),`
        + ` columns = dim ${dims[1]} (${fmtInt(blocks.shape[dims[1]])}).`
      : dims.length === 1 ? `Each cell outlines the whole vector (dim ${dims[0]}, ${fmtInt(blocks.shape[dims[0]])}).`
        : "A scalar: every rank holds it whole.",
    hidden.length ? ` Dims ${hidden.map((d) => d.dim).join(", ")} are split too: see a rank's ranges.`
      : ""));
}

/** The side box: one rank's block in words. */
function detail(blocks, r) {
  const partial = r.partial.length
    ? `${partialText(r.partial)} over ${r.partial.map((p) => p.axis).join(", ")}: `
      + `reduce with ranks ${fmtRanks(r.partial_group)}`
    : "no: final values";
  return [
    h("h2", {}, `Rank ${r.rank}`),
    h("dl", {},
      h("dt", {}, "mesh coordinate"), h("dd", { "data-field": "coord" }, coordText(blocks.mesh, r.coord)),
      h("dt", {}, "local shape"), h("dd", { "data-field": "local-shape" }, fmtShape(r.local_shape)),
      h("dt", {}, "partial"), h("dd", { "data-field": "partial" }, partial),
      h("dt", {}, "replica group"), h("dd", { "data-field": "replicas" },
        r.replica_group.length < 2 ? "none: only this rank holds this block"
          : `ranks ${fmtRanks(r.replica_group)} hold this block${r.partial.length
            ? " (each its own partial values: equal once each partial group is reduced)" : ""}`)),
    h("table", { "aria-label": `index ranges of rank ${r.rank}` },
      h("thead", {}, h("tr", {}, h("th", {}, "dim"), h("th", {}, "range"),
        h("th", { class: "num" }, "of"), h("th", {}, "split by"))),
      h("tbody", {}, r.ranges.map((rg, d) => h("tr", { "data-dim": d },
        h("td", {}, d), h("td", {}, fmtRange(rg)), h("td", { class: "num" }, fmtInt(blocks.shape[d])),
        h("td", {}, blocks.dims[d].axes.join(", ") || "–"))))),
  ];
}

export async function render(root, ctx) {
  const planId = Number(ctx.params.id);
  const search = ctx.query.toString();
  root.append(h("style", {}, STYLE), hatchPatterns(), planTabs(planId, "sharding", search),
    h("h1", {}, `Plan ${planId} · sharding`));
  let listing;
  try {
    listing = await api(`/api/plans/${planId}/values`);
  } catch (err) {
    root.append(errorBox(err));
    return;
  }
  if (ctx.signal.aborted) return;
  const names = new Set(listing.values.map((v) => v.name));
  const input = h("input", { id: "sharding-value", list: "sharding-values", autocomplete: "off",
    spellcheck: "false", placeholder: "a value of the training graph" });
  const datalist = h("datalist", { id: "sharding-values" }, listing.values.map((v) =>
    h("option", { value: v.name }, `${v.spec} · ${v.dtype}[${v.shape.join(", ")}]`)));
  const fieldError = h("p", { class: "field-error", id: "sharding-value-error", role: "alert" });
  const show = h("button", { type: "button" }, "Show");
  let compact = ctx.query.get("compact") === "1";
  const compactToggle = h("button", { type: "button", class: "secondary", hidden: true,
    "aria-pressed": String(compact), id: "sharding-compact" }, "Compact: heat map of block index");
  const main = h("div", { "aria-live": "polite" });
  const side = h("aside", { class: "panel", id: "rank-detail", "aria-live": "polite",
    "aria-label": "rank detail" }, h("p", { class: "muted" },
    "Hover or focus a rank to see its local shape and index ranges."));
  root.append(
    h("div", { class: "sh-controls" },
      h("div", {}, h("label", { for: "sharding-value" }, "Value"), input, datalist),
      show, compactToggle),
    fieldError, legend(),
    h("div", { class: "sh-layout" }, main, side));

  let loaded = 0;
  let current = null;
  let selected = null;

  function select(rank) {
    if (!current) return;
    const r = current.ranks.find((x) => x.rank === rank);
    if (!r) return;
    selected = rank;
    ctx.setQuery({ rank });
    side.replaceChildren(...detail(current, r));
    const peers = new Set([...r.replica_group, ...r.partial_group]);
    for (const cell of main.querySelectorAll(".sh-cell")) {
      const n = Number(cell.dataset.rank);
      cell.classList.toggle("sh-selected", n === rank);
      cell.classList.toggle("sh-peer", n !== rank && peers.has(n));
    }
  }

  async function load(name, rank) {
    const ticket = ++loaded;
    input.value = name;
    fieldError.textContent = "";
    input.removeAttribute("aria-invalid");
    if (!names.has(name)) {
      input.setAttribute("aria-invalid", "true");
      input.setAttribute("aria-describedby", "sharding-value-error");
      fieldError.textContent = `plan ${planId} has no value '${name}'`;
      return;
    }
    main.replaceChildren(h("p", { class: "loading" }, "loading…"));
    let blocks;
    try {
      blocks = await api(`/api/plans/${planId}/blocks/${encodeURIComponent(name)}`);
    } catch (err) {
      if (ticket === loaded) main.replaceChildren(errorBox(err));
      return;
    }
    if (ticket !== loaded || ctx.signal.aborted) return;
    current = blocks;
    ctx.setQuery({ value: name });
    draw(blocks, rank ?? selected);
  }

  /** Draw `blocks` (cells, or the heat map when compact and large) and select `keep`. */
  function draw(blocks, keep) {
    const large = blocks.ranks.length > COMPACT_OVER;
    compactToggle.hidden = !large;
    compactToggle.setAttribute("aria-pressed", String(compact));
    const heat = compact && large;
    main.replaceChildren(facts(blocks),
      ...(heat ? [heatLegend(new Set(blockColours(blocks).values()).size)] : []),
      diagram(blocks, heat));
    for (const cell of main.querySelectorAll(".sh-cell")) {
      const n = Number(cell.dataset.rank);
      cell.addEventListener("mouseenter", () => select(n));
      cell.addEventListener("focus", () => select(n));
      cell.addEventListener("click", () => select(n));
      cell.addEventListener("keydown", (e) => {
        const cells = [...main.querySelectorAll(".sh-cell")];
        const at = cells.indexOf(cell);
        const step = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 }[e.key];
        if (step) {
          e.preventDefault();
          cells[(at + step + cells.length) % cells.length].focus();
        } else if (e.key === "Enter" || e.key === " ") {
          e.preventDefault();
          select(n);
        }
      });
    }
    if (keep !== null && blocks.ranks.some((x) => x.rank === keep)) select(keep);
    else {
      selected = null;
      ctx.setQuery({ rank: null });
      side.replaceChildren(h("p", { class: "muted" },
        "Hover or focus a rank to see its local shape and index ranges."));
    }
  }

  compactToggle.addEventListener("click", () => {
    compact = !compact;
    ctx.setQuery({ compact: compact ? 1 : null });
    if (current) draw(current, selected);
  });
  const go = () => load(input.value.trim(), null);
  input.addEventListener("change", go);
  show.addEventListener("click", go);

  const wanted = ctx.query.get("value") || listing.default;
  const rankText = ctx.query.get("rank");
  const rank = rankText !== null && /^\d+$/.test(rankText) ? Number(rankText) : null;
  if (wanted) await load(wanted, rank);
  else main.replaceChildren(h("p", { class: "muted" }, "This plan has no values."));
}
