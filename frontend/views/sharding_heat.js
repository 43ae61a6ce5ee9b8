// The compact sharding diagram of a large mesh: a heat map of the block index each rank
// holds, one small square per rank laid out on the mesh as in the full diagram (first axis
// down, second across). Ranks that hold the same block share its number and colour; the
// ranks of a partial value are outlined in red.
import { s } from "../svg.js";
import { h } from "../ui.js";

const VIRIDIS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"];
const CELL = 30;

function mix(a, b, f) {
  const rgb = (c) => [1, 3, 5].map((i) => Number.parseInt(c.slice(i, i + 2), 16));
  const [x, y] = [rgb(a), rgb(b)];
  return `rgb(${x.map((v, i) => Math.round(v + (y[i] - v) * f)).join(",")})`;
}

/** The colour of block `i` of `n` on a sequential (viridis) scale. */
export function heatColour(i, n) {
  const t = n > 1 ? i / (n - 1) : 0;
  const x = t * (VIRIDIS.length - 1);
  const k = Math.min(Math.floor(x), VIRIDIS.length - 2);
  return mix(VIRIDIS[k], VIRIDIS[k + 1], x - k);
}

/** One heat map: `rowsAxis` down (or null), `colsAxis` across; `fixed` pins the others.
 * `colours`: rank -> block index; `describe(r)`: a rank's accessible name. */
export function heatGrid(blocks, byCoord, colours, rowsAxis, colsAxis, fixed, describe) {
  const axes = blocks.mesh.axes;
  const n = new Set(colours.values()).size;
  const nRows = rowsAxis === null ? 1 : axes[rowsAxis].size;
  const nCols = axes[colsAxis].size;
  const left = rowsAxis === null ? 8 : 60;
  const top = 36;
  const width = Math.max(left + nCols * CELL + 8, 120);
  const height = top + nRows * CELL + 8;
  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "group",
    class: "sh-heatmap", "aria-label": `block index by rank, ${[rowsAxis, colsAxis]
      .filter((k) => k !== null).map((k) => axes[k].name).join(" × ")}` });
  svg.append(s("text", { class: "sh-axis", x: left, y: 14 }, `${axes[colsAxis].name} →`));
  for (let c = 0; c < nCols; c += 1) {
    svg.append(s("text", { class: "sh-label", x: left + c * CELL + CELL / 2, y: 30,
      "text-anchor": "middle" }, c));
  }
  if (rowsAxis !== null) {
    svg.append(s("text", { class: "sh-axis", x: 8, y: 30 }, `${axes[rowsAxis].name} ↓`));
    for (let rr = 0; rr < nRows; rr += 1) {
      svg.append(s("text", { class: "sh-label", x: left - 8, y: top + rr * CELL + CELL / 2 + 4,
        "text-anchor": "end" }, rr));
    }
  }
  for (let rr = 0; rr < nRows; rr += 1) {
    for (let c = 0; c < nCols; c += 1) {
      const coord = [...fixed];
      if (rowsAxis !== null) coord[rowsAxis] = rr;
      coord[colsAxis] = c;
      const r = byCoord.get(coord.join(","));
      const block = colours.get(r.rank);
      const partial = r.partial.length > 0;
      const label = describe(r);
      svg.append(s("g", { class: "sh-cell sh-heat-cell", tabindex: 0, role: "button",
        "aria-label": label, "data-rank": r.rank, "data-block": block,
        "data-kind": partial ? "partial" : r.replica_group.length > 1 ? "replicate" : "shard",
        transform: `translate(${left + c * CELL},${top + rr * CELL})` },
      s("title", {}, label),
      s("rect", { class: "sh-heat", x: 1, y: 1, width: CELL - 2, height: CELL - 2,
        fill: heatColour(block, n) }),
      s("text", { class: "sh-heat-text", x: CELL / 2, y: CELL / 2 + 4, "text-anchor": "middle",
        fill: n > 1 && block / (n - 1) > 0.6 ? "#1d2330" : "#fff" }, block)));
    }
  }
  return svg;
}

/** The scale of the heat map: block 0 to block n - 1. */
export function heatLegend(n) {
  const stops = Array.from({ length: 5 }, (_, k) => heatColour((k / 4) * Math.max(n - 1, 0), n));
  return h("p", { class: "sh-heat-legend" }, "block index: ",
    h("span", { class: "sh-heat-scale", style: `background: linear-gradient(to right, ${stops.join(", ")})` }),
    ` 0 … ${Math.max(n - 1, 0)} (${n} distinct block${n === 1 ? "" : "s"}; equal numbers: replicas;`
    + " red outline: partial values)");
}
