// Sizes and shapes of the op graph, without drawing anything: text measuring, how big a node
// or an edge's label block is, the input handed to the layout worker (`geometry`), and the
// SVG path through the points the layout gives an edge. draw.js draws with the same numbers,
// so what dagre reserves is what gets drawn.
import { fmtInt } from "../../ui.js";

const NODE_H = 46;
const FONT = "12px system-ui, sans-serif";
export const SMALL = "11px system-ui, sans-serif";
export const MAX_BADGES = 3;

const measureCanvas = document.createElement("canvas").getContext("2d");
export function textWidth(text, font = FONT) {
  measureCanvas.font = font;
  return measureCanvas.measureText(text).width;
}

export function shorten(text, font, max) {
  if (textWidth(text, font) <= max) return text;
  let lo = 0;
  let hi = text.length;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (textWidth(`…${text.slice(text.length - mid)}`, font) <= max) lo = mid; else hi = mid - 1;
  }
  return `…${text.slice(text.length - lo)}`;
}

// -- node and edge geometry ------------------------------------------------------------------

export function nodeSubtitle(node) {
  if (node.kind === "module") {
    const parts = [`${fmtInt(node.ops)} ops`];
    if (node.collectives) parts.push(`${fmtInt(node.collectives)} comm`);
    return parts.join(" · ");
  }
  return `${node.op_kind} · ${node.role}`;
}

export function nodeSize(node) {
  const title = textWidth(node.label, "600 12px system-ui, sans-serif");
  const sub = textWidth(nodeSubtitle(node), SMALL) + (node.fallback ? 60 : 0);
  const extra = node.repeat > 1 ? 42 : 0;
  const width = Math.min(300, Math.max(110, Math.max(title, sub) + 30 + extra));
  return { width: Math.ceil(width), height: NODE_H };
}

/** An edge's collectives grouped by kind and axes, one badge per group. */
export function badgeGroups(collectives) {
  const groups = new Map();
  for (const c of collectives) {
    const key = `${c.kind} ${c.axes.join(",")}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(c);
  }
  return [...groups.entries()].map(([text, items]) => ({
    text: items.length > 1 ? `${text} ×${items.length}` : text, items,
  }));
}

export function edgeLabelSize(edge, boundary) {
  const groups = badgeGroups(edge.collectives).slice(0, MAX_BADGES);
  const badgeW = groups.reduce((w, g) => w + textWidth(g.text, SMALL) + 14, 0);
  const specW = boundary ? 0 : textWidth(edge.label, SMALL) + 10;
  if (!groups.length) return { width: Math.ceil(specW), height: boundary ? 0 : 16 };
  return { width: Math.ceil(Math.max(specW, badgeW)), height: boundary ? 18 : 36 };
}

export function pathOf(points) {
  if (!points?.length) return "";
  let d = `M${points[0].x},${points[0].y}`;
  if (points.length === 2) return `${d}L${points[1].x},${points[1].y}`;
  for (let i = 1; i < points.length - 1; i += 1) {
    const mid = { x: (points[i].x + points[i + 1].x) / 2, y: (points[i].y + points[i + 1].y) / 2 };
    d += ` Q${points[i].x},${points[i].y} ${i === points.length - 2 ? points[i + 1].x : mid.x},${
      i === points.length - 2 ? points[i + 1].y : mid.y}`;
  }
  return d;
}

// Data flowing to a node that starts earlier in program order (gradients going back to
// the module of their forward op) is laid out as a reversed edge, so the forward pass reads
// top-down and the backward pass climbs back up; the ids of those edges come back as
// `reversed`, and `drawGraph` turns their points around.
export function geometry(view) {
  const nodes = view.nodes.map((n) => ({ id: n.id, ...nodeSize(n) }));
  const order = new Map(view.nodes.map((n) => [n.id, n.order]));
  const edges = view.edges.map((e) => {
    const back = order.get(e.target) < order.get(e.source);
    return {
      id: e.id, source: back ? e.target : e.source, target: back ? e.source : e.target,
      ...edgeLabelSize(e, false), weight: back ? 1 : 2,
    };
  });
  const reversed = new Set(edges.filter((e, i) => e.source !== view.edges[i].source)
    .map((e) => e.id));
  if (view.inputs.length) {
    nodes.push({ id: "__in__", width: 100, height: 24 });
    for (const e of view.inputs) {
      edges.push({ id: `__in__->${e.target}`, source: "__in__", target: e.target,
        ...edgeLabelSize(e, true), weight: 0.5 });
    }
  }
  if (view.outputs.length) {
    nodes.push({ id: "__out__", width: 100, height: 24 });
    for (const e of view.outputs) {
      edges.push({ id: `${e.source}->__out__`, source: e.source, target: "__out__",
        ...edgeLabelSize(e, true), weight: 0.5 });
    }
  }
  return { nodes, edges, reversed };
}
