// Drawing the op graph as SVG once the layout worker has placed it: the nodes (modules and
// ops, coloured by role), the edges, their placement labels and collective badges, and the
// "from/to outside" ports. Nothing here holds view state: what a click or a key does is the
// view's business, reached through the `handlers` object given to `drawGraph`:
//   openScope(scope)        - expand a module node
//   selectOp(node)          - an op node was activated
//   selectEdge(edge)        - an edge, its label, or a badge standing for several collectives
//   selectCollective(name)  - a badge standing for one collective
import { h, ROLE_COLORS } from "../../ui.js";
import {
  badgeGroups, MAX_BADGES, nodeSubtitle, pathOf, shorten, SMALL, textWidth,
} from "./geometry.js";

const SVG_NS = "http://www.w3.org/2000/svg";

/** An SVG element: svg("rect", {x: 1}, child, ...). */
export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function roleColor(role) {
  return ROLE_COLORS[role] ?? "#8b93a5";
}

/** A role's colour as a small HTML square, for the legend and the op panel. */
export function roleSwatch(role) {
  return h("span", { class: "gr-swatch", style: `background:${roleColor(role)}` });
}

/** Enter and Space activate a focusable SVG "button" the way a click does. */
function onActivate(el, action) {
  el.addEventListener("click", action);
  el.addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") { event.preventDefault(); action(); }
  });
}

/** The graph of one scope: `view` as the API gave it, `placed` as the layout worker answered,
 * `reversed` the ids of edges laid out backwards (see geometry.js). Returns the node, edge
 * and label layers, in drawing order. */
export function drawGraph(view, placed, reversed, handlers) {
  const nodeLayer = svg("g", { class: "gr-nodes" });
  const edgeLayer = svg("g", { class: "gr-edges" });
  const labelLayer = svg("g", { class: "gr-labels" });

  for (const node of view.nodes) {
    const at = placed.nodes[node.id];
    if (at) nodeLayer.append(drawNode(node, at, handlers));
  }
  for (const [id, label, where] of [["__in__", "from outside", "values made outside"],
    ["__out__", "to outside", "values read outside"]]) {
    const at = placed.nodes[id];
    if (!at) continue;
    nodeLayer.append(svg("g", { class: "gr-port", "aria-hidden": "true",
      transform: `translate(${at.x - at.width / 2},${at.y - at.height / 2})` },
    svg("rect", { width: at.width, height: at.height, rx: 12 }),
    svg("text", { x: at.width / 2, y: 16, "text-anchor": "middle" }, label),
    svg("title", {}, `${where} ${view.scope || "the root"}`)));
  }
  const boundary = [
    ...view.inputs.map((e) => ({ ...e, id: `__in__->${e.target}`, boundary: true })),
    ...view.outputs.map((e) => ({ ...e, id: `${e.source}->__out__`, boundary: true })),
  ];
  for (const edge of [...view.edges, ...boundary]) {
    const at = placed.edges[edge.id];
    if (!at) continue;
    const comm = edge.collectives.length > 0;
    const points = reversed?.has(edge.id) ? [...at.points].reverse() : at.points;
    const d = pathOf(points);
    const cls = `gr-edge${comm ? " gr-comm" : ""}${edge.boundary ? " gr-boundary" : ""}`;
    edgeLayer.append(svg("path", { class: cls, d,
      "marker-end": `url(#${comm ? "gr-arrow-comm" : "gr-arrow"})` }));
    edgeLayer.append(svg("path", { class: "gr-edge-hit", d, "data-edge": edge.id,
      onclick: () => handlers.selectEdge(edge) }, svg("title", {}, edgeTitle(edge))));
    const label = drawEdgeLabel(edge, at, handlers);
    if (label) labelLayer.append(label);
  }
  return [nodeLayer, edgeLayer, labelLayer];
}

function drawNode(node, at, handlers) {
  const { width, height } = at;
  const color = roleColor(node.role);
  const folded = node.repeat > 1;
  const expandable = node.kind === "module";
  const what = expandable
    ? `module ${node.label}${folded ? `, ${node.repeat} folded repeats (${node.members})` : ""}, ` +
      `${node.ops} ops, mostly ${node.role}${node.fallback ? ", holds fallback ops" : ""}; ` +
      "press Enter to open it"
    : `op ${node.id}, ${node.op_kind}, ${node.role}${node.fallback ? ", fallback" : ""}; ` +
      "press Enter for details";
  const g = svg("g", {
    class: `gr-node${node.fallback ? " gr-fallback" : ""}`,
    transform: `translate(${at.x - width / 2},${at.y - height / 2})`,
    tabindex: 0, role: "button", "aria-label": what,
    "data-id": node.id, "data-kind": node.kind, "data-role": node.role,
  });
  if (folded) {
    for (const off of [8, 4]) {
      g.append(svg("rect", { class: "gr-stack", x: off, y: -off, width, height, rx: 6 }));
    }
  }
  g.append(svg("rect", { class: "gr-body", width, height, rx: expandable ? 6 : 14,
    stroke: color }));
  g.append(svg("rect", { x: 0, y: 0, width: 6, height, rx: 3, fill: color }));
  const textMax = width - 22 - (folded ? 40 : 0);
  g.append(svg("text", { class: "gr-title", x: 13, y: 19 },
    shorten(node.label, "600 12px system-ui, sans-serif", textMax)));
  const sub = svg("text", { class: "gr-sub", x: 13, y: 36 },
    shorten(nodeSubtitle(node), SMALL, textMax - (node.fallback ? 58 : 0)));
  g.append(sub);
  if (node.fallback) {
    g.append(svg("text", { class: "gr-fb", x: width - (folded ? 48 : 8), y: 36,
      "text-anchor": "end" }, "fallback"));
  }
  if (expandable && node.ops > 0) {
    // the module's ops by role, as a thin bar along the bottom
    let x = 10;
    const span = width - 18;
    for (const [role, count] of Object.entries(node.roles)) {
      const w = (span * count) / node.ops;
      g.append(svg("rect", { x, y: height - 6, width: Math.max(w, 0.5), height: 3,
        fill: roleColor(role) }, svg("title", {}, `${count} ${role}`)));
      x += w;
    }
  }
  if (folded) {
    g.append(svg("rect", { x: width - 40, y: 9, width: 32, height: 20, rx: 10, fill: color }));
    g.append(svg("text", { class: "gr-repeat", x: width - 24, y: 23, "text-anchor": "middle" },
      `x${node.repeat}`));
  }
  g.append(svg("title", {}, what));
  onActivate(g, () => {
    performance.mark("graph:click");
    return expandable ? handlers.openScope(node.expand) : handlers.selectOp(node);
  });
  return g;
}

function edgeTitle(edge) {
  const values = edge.values.map((v) => `${v.value}: ${v.spec ?? "?"}`).join("\n");
  const more = edge.count > edge.values.length ? `\n… ${edge.count - edge.values.length} more` : "";
  return `${values}${more}`;
}

function drawEdgeLabel(edge, at, handlers) {
  const groups = badgeGroups(edge.collectives);
  if (edge.boundary && !groups.length) return null;
  const g = svg("g", { class: "gr-elabel-group" });
  let y = at.y - (groups.length && !edge.boundary ? 17 : 8);
  if (!edge.boundary) {
    const w = textWidth(edge.label, SMALL) + 10;
    const label = svg("g", {
      class: "gr-elabel", tabindex: 0, role: "button", "data-edge": edge.id,
      "aria-label": `edge ${edge.source} to ${edge.target}: ${edge.count} value` +
        `${edge.count > 1 ? "s" : ""}, ${edge.label}`,
      transform: `translate(${at.x - w / 2},${y})`,
    }, svg("rect", { width: w, height: 16, rx: 3 }),
    svg("text", { x: w / 2, y: 12, "text-anchor": "middle" }, edge.label),
    svg("title", {}, edgeTitle(edge)));
    onActivate(label, () => handlers.selectEdge(edge));
    g.append(label);
    y += 19;
  }
  const shown = groups.slice(0, MAX_BADGES);
  const widths = shown.map((b) => textWidth(b.text, SMALL) + 12);
  let x = at.x - (widths.reduce((a, b) => a + b, 0) + 2 * (shown.length - 1)) / 2;
  shown.forEach((group, i) => {
    const first = group.items[0];
    const text = i === MAX_BADGES - 1 && groups.length > MAX_BADGES
      ? `${group.text} +${groups.length - MAX_BADGES}` : group.text;
    const w = widths[i];
    const badge = svg("g", {
      class: "gr-badge", tabindex: 0, role: "button", "data-collective": first.name,
      "aria-label": `${first.kind} on ${first.axes.join(", ")}: ${first.value} ` +
        `${first.from} to ${first.to} for ${first.consumer}` +
        `${group.items.length > 1 ? ` and ${group.items.length - 1} more` : ""}`,
      transform: `translate(${x},${y})`,
    }, svg("rect", { width: w, height: 16, rx: 8 }),
    svg("text", { x: w / 2, y: 12, "text-anchor": "middle" },
      shorten(text, SMALL, Math.max(w - 8, 20))),
    svg("title", {}, group.items.map((c) => c.reason).join("\n")));
    // one collective opens its own panel; a group, or a label hiding more, opens the edge
    onActivate(badge, () => (group.items.length === 1 && groups.length <= MAX_BADGES
      ? handlers.selectCollective(first.name)
      : handlers.selectEdge(edge)));
    g.append(badge);
    x += w + 2;
  });
  return g;
}
