// The op graph of a plan, one module scope at a time.
//
// Nodes are the scope's child modules (repeated layers folded into one "×N" node) and its own
// ops, coloured by role; edges carry values, labelled with their placement; communication
// ops are badges on the edge they sit on. dagre lays the graph out in a Web Worker
// (/graph_worker.js) so the page never freezes. Expanding a module (click, Enter or Space)
// opens its scope; clicking an op, an edge or a badge opens the side panel. URL state:
// `scope`, and the selection: `op`, `value` or `collective` (a permalink reopens the panel).
//
// This file wires the view together: its state, the page skeleton, the layout worker,
// loading a scope, the breadcrumb and the selection's URL query. The parts live in graph/:
// style.js (CSS), geometry.js (sizes, layout input), draw.js (SVG drawing), panzoom.js,
// search.js (the search box) and panel.js (the side panel and the selection).
import { api, ApiError } from "../api.js";
import { errorBox, h, planTabs, ROLE_COLORS } from "../ui.js";
import { drawGraph, roleSwatch, svg } from "./graph/draw.js";
import { geometry } from "./graph/geometry.js";
import { sidePanel } from "./graph/panel.js";
import { panZoom } from "./graph/panzoom.js";
import { searchBox } from "./graph/search.js";
import { injectStyle } from "./graph/style.js";

/** The layout worker, one for the view's lifetime (ended when `signal` aborts). Returns
 * `layout(id, nodes, edges)`, a promise of the placed graph; the worker's progress reports
 * go to `onProgress(stage, fraction)`. */
function layoutWorker(signal, onProgress) {
  const worker = new Worker("/graph_worker.js");
  const waiting = new Map();
  worker.onmessage = (event) => {
    const msg = event.data;
    const pending = waiting.get(msg.id);
    if (!pending) return;
    if (msg.type === "progress") {
      onProgress(msg.stage, msg.fraction);
    } else {
      waiting.delete(msg.id);
      if (msg.type === "done") pending.resolve(msg);
      else pending.reject(new Error(`layout failed: ${msg.message}`));
    }
  };
  worker.onerror = (event) => {
    for (const pending of waiting.values()) pending.reject(new Error(event.message));
    waiting.clear();
  };
  signal.addEventListener("abort", () => worker.terminate());

  return (id, nodes, edges) => new Promise((resolve, reject) => {
    waiting.set(id, { resolve, reject });
    worker.postMessage({ id, nodes, edges, options: {} });
  });
}

export async function render(root, ctx) {
  performance.mark("graph:render");
  injectStyle();
  const planId = ctx.params.id;
  const base = `/api/plans/${planId}`;
  const state = {
    scope: ctx.query.get("scope") ?? "",
    view: null,
    layout: null,
    request: 0,
    selected: null, // {type: "op"|"value"|"collective"|"edge", name}
  };

  // -- the page ----------------------------------------------------------------------------

  const crumbs = h("nav", { class: "gr-crumbs", "aria-label": "scope" });
  const search = searchBox({ base, signal: ctx.signal, onHit: openHit });
  const foldedNote = h("p", { class: "gr-folded-note muted", "aria-live": "polite" });

  const statusText = h("span", {}, "loading the graph…");
  const statusBar = h("progress", { "aria-label": "layout progress" });
  const status = h("div", { class: "gr-status", role: "status" }, statusText, statusBar);
  const viewport = svg("g", { class: "gr-viewport" });
  const canvas = svg("svg", { role: "group", "aria-label": "op graph", "data-state": "loading" },
    svg("defs", {},
      svg("marker", { id: "gr-arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7,
        markerHeight: 7, orient: "auto-start-reverse" },
      svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#8b93a5" })),
      svg("marker", { id: "gr-arrow-comm", viewBox: "0 0 10 10", refX: 9, refY: 5,
        markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#e45756" }))),
    viewport);
  const { zoomBy, fit } = panZoom(canvas, viewport, () => state.layout);
  const zoom = h("div", { class: "gr-zoom" },
    h("button", { type: "button", class: "secondary", "aria-label": "Zoom in", title: "Zoom in",
      onclick: () => zoomBy(1.25) }, "+"),
    h("button", { type: "button", class: "secondary", "aria-label": "Zoom out",
      title: "Zoom out", onclick: () => zoomBy(0.8) }, "−"),
    h("button", { type: "button", class: "secondary", "aria-label": "Fit to view",
      title: "Fit to view", onclick: () => fit(false) }, "Fit"));
  const box = h("div", { class: "gr-box" }, zoom, status, canvas);
  const legend = h("ul", { class: "gr-legend", "aria-label": "legend" },
    Object.keys(ROLE_COLORS).filter((r) => r !== "comm").map((role) =>
      h("li", {}, roleSwatch(role), role)),
    h("li", {}, h("span", { class: "gr-swatch", style: `background:${ROLE_COLORS.comm}` }),
      "collective (badge on an edge)"),
    h("li", {}, h("span", { class: "gr-swatch",
      style: "border:2px dashed #b3261e;background:#fff" }), "fallback op"),
    h("li", {}, h("strong", {}, "×N"), "folded repeated modules"),
    h("li", { class: "muted" }, "edge label: the value's placement"));
  const panel = h("aside", { class: "panel gr-panel", "aria-label": "details",
    "aria-live": "polite", hidden: true });
  const layout = h("div", { class: "gr-layout gr-nopanel" }, h("div", {}, legend, box), panel);

  root.append(
    h("h1", {}, `Plan ${planId} · graph`),
    planTabs(planId, "graph"),
    h("div", { class: "gr-bar" }, crumbs, search),
    foldedNote,
    layout,
  );

  const layoutInWorker = layoutWorker(ctx.signal, (stage, fraction) => {
    statusText.textContent = `${stage}…`;
    statusBar.value = fraction;
  });
  const details = sidePanel({ panel, layout, viewport, state, base,
    saveSelection: () => ctx.setQuery(selectionQuery()) });
  const { markSelected, showSelection } = details;
  // what clicks and keys on the drawing do
  const handlers = {
    openScope,
    selectOp: details.selectOp,
    selectEdge: details.selectEdge,
    selectCollective: details.selectCollective,
  };

  // -- breadcrumb and search hits ----------------------------------------------------------

  function scopeHref(scope) {
    return `#/plans/${planId}/graph${scope ? `?scope=${encodeURIComponent(scope)}` : ""}`;
  }

  function drawCrumbs(view) {
    const items = view.breadcrumb.map((c, i) => {
      const last = i === view.breadcrumb.length - 1;
      return h("li", {}, h("a", {
        href: scopeHref(c.scope),
        "aria-current": last ? "location" : null,
        onclick: (event) => { event.preventDefault(); openScope(c.scope); },
      }, c.label));
    });
    crumbs.replaceChildren(h("ol", {}, items));
    const folded = view.folded;
    foldedNote.textContent = folded
      ? `${folded.scope} stands for ${folded.repeat} repeats of the same module ` +
        `(${folded.members}); the graph shows ${folded.representative ? "the first" : "this one"}.`
      : "";
  }

  // a module hit opens its scope; anything else opens the scope it is in, selected
  async function openHit(hit) {
    if (hit.kind === "module") {
      await openScope(hit.scope);
      return;
    }
    const select = hit.kind === "op" ? { type: "op", name: hit.name }
      : hit.kind === "collective" ? { type: "collective", name: hit.name }
        : { type: "value", name: hit.name };
    await openScope(hit.scope, select);
  }

  // -- loading and drawing a scope ---------------------------------------------------------

  async function openScope(scope, select = undefined) {
    state.scope = scope;
    if (select !== undefined) state.selected = select;
    ctx.setQuery({ scope: scope || null, ...selectionQuery() });
    await loadScope();
    if (select !== undefined) showSelection();
  }

  function selectionQuery() {
    const sel = state.selected;
    return {
      op: sel?.type === "op" ? sel.name : null,
      value: sel?.type === "value" ? sel.name : null,
      collective: sel?.type === "collective" ? sel.name : null,
    };
  }

  async function loadScope() {
    const request = ++state.request;
    const scope = state.scope;
    canvas.setAttribute("data-state", "loading");
    canvas.setAttribute("data-scope", scope);
    status.hidden = false;
    statusText.textContent = `loading ${scope || "the root"}…`;
    statusBar.removeAttribute("value");
    let view;
    try {
      view = await api(`${base}/graph?scope=${encodeURIComponent(scope)}`);
    } catch (err) {
      if (request !== state.request || ctx.signal.aborted) return;
      status.hidden = true;
      viewport.replaceChildren();
      canvas.setAttribute("data-state", "error");
      box.querySelector(".error")?.remove();
      box.append(errorBox(err));
      if (err instanceof ApiError && err.status === 404 && scope) {
        crumbs.replaceChildren(h("a", { href: scopeHref(""), onclick: (event) => {
          event.preventDefault(); openScope("");
        } }, "back to the root"));
      }
      return;
    }
    if (request !== state.request || ctx.signal.aborted) return;
    performance.mark("graph:data");
    box.querySelector(".error")?.remove();
    state.view = view;
    drawCrumbs(view);
    const { nodes, edges, reversed } = geometry(view);
    statusText.textContent = `laying out ${nodes.length} nodes…`;
    let placed;
    try {
      placed = await layoutInWorker(request, nodes, edges);
    } catch (err) {
      if (request !== state.request || ctx.signal.aborted) return;
      status.hidden = true;
      box.append(errorBox(err));
      return;
    }
    if (request !== state.request || ctx.signal.aborted) return;
    performance.mark("graph:layout");
    state.layout = placed;
    viewport.replaceChildren(...drawGraph(view, placed, reversed, handlers));
    fit(true);
    status.hidden = true;
    canvas.setAttribute("data-layout-ms", placed.ms.toFixed(1));
    canvas.setAttribute("data-state", "ready");
    performance.mark("graph:drawn");
    markSelected();
  }

  // -- start -------------------------------------------------------------------------------

  const first = ["op", "value", "collective"].find((key) => ctx.query.get(key));
  if (first) state.selected = { type: first, name: ctx.query.get(first) };
  if (state.selected) showSelection();
  await loadScope();
}
