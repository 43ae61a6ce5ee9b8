// Lays out the op graph with dagre off the main thread (a classic worker: the page never
// freezes, however large the scope).
//
// In:  {id, nodes: [{id, width, height}], edges: [{id, source, target, width, height,
//       weight}], options: {rankdir, ...}}
// Out: {id, type: "progress", stage, fraction}
//      {id, type: "done", nodes: {id: {x, y, width, height}}, edges: {id: {points, x, y}},
//       width, height, ms}
//      {id, type: "error", message}
/* global dagre */
importScripts("/vendor/dagre.min.js");

self.onmessage = (event) => {
  const { id, nodes, edges, options } = event.data;
  const started = performance.now();
  const progress = (stage, fraction) => self.postMessage({ id, type: "progress", stage, fraction });
  try {
    progress(`building a graph of ${nodes.length} nodes and ${edges.length} edges`, 0.1);
    const g = new dagre.graphlib.Graph({ multigraph: true });
    g.setGraph({
      rankdir: "TB", nodesep: 28, ranksep: 46, edgesep: 14, marginx: 24, marginy: 24,
      acyclicer: "greedy", ranker: "network-simplex", ...(options ?? {}),
    });
    g.setDefaultEdgeLabel(() => ({}));
    for (const n of nodes) g.setNode(n.id, { width: n.width, height: n.height });
    for (const e of edges) {
      g.setEdge(e.source, e.target, {
        width: e.width ?? 0, height: e.height ?? 0, labelpos: "c", weight: e.weight ?? 1,
        minlen: e.minlen ?? 1,
      }, e.id);
    }
    progress("laying out", 0.3);
    dagre.layout(g);
    progress("placing", 0.9);
    const outNodes = {};
    for (const v of g.nodes()) {
      const n = g.node(v);
      outNodes[v] = { x: n.x, y: n.y, width: n.width, height: n.height };
    }
    const outEdges = {};
    for (const e of g.edges()) {
      const label = g.edge(e);
      outEdges[e.name] = { points: label.points, x: label.x, y: label.y };
    }
    const size = g.graph();
    self.postMessage({
      id, type: "done", nodes: outNodes, edges: outEdges, width: size.width,
      height: size.height, ms: performance.now() - started,
    });
  } catch (err) {
    self.postMessage({ id, type: "error", message: String(err?.message ?? err) });
  }
};
