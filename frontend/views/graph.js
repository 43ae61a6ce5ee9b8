// The op graph of a plan, one module scope at a time.
//
// Nodes are the scope's child modules (repeated layers folded into one "×N" node) and its own
// ops, coloured by role; edges carry values, labelled with their placement; communication
// ops are badges on the edge they sit on. dagre lays the graph out in a Web Worker
// (/graph_worker.js) so the page never freezes. Expanding a module (click, Enter or Space)
// opens its scope; clicking an op, an edge or a badge opens the side panel. URL state:
// `scope`, and the selection: `op`, `value` or `collective` (a permalink reopens the panel).
import { api, ApiError } from "../api.js";
import { errorBox, fmtBytes, fmtInt, fmtTime, h, planTabs, ROLE_COLORS } from "../ui.js";

const SVG_NS = "http://www.w3.org/2000/svg";
const NODE_H = 46;
const FONT = "12px system-ui, sans-serif";
const SMALL = "11px system-ui, sans-serif";
const MAX_BADGES = 3;

const STYLE = `
.gr-bar { display: flex; gap: 1.2rem; align-items: end; flex-wrap: wrap; margin-bottom: .6rem; }
.gr-crumbs ol { list-style: none; display: flex; flex-wrap: wrap; gap: .2rem; padding: 0;
  margin: 0; }
.gr-crumbs li + li::before { content: "›"; color: var(--muted, #5b6475); margin: 0 .3rem; }
.gr-crumbs [aria-current] { font-weight: 600; color: inherit; text-decoration: none; }
.gr-search { position: relative; }
.gr-search input { width: 22rem; max-width: 100%; }
.gr-results { position: absolute; z-index: 5; left: 0; top: 100%; width: 34rem;
  max-width: 90vw; max-height: 22rem; overflow: auto; list-style: none; margin: .2rem 0;
  padding: .2rem; background: #fff; border: 1px solid var(--line, #dde1ea); border-radius: 5px;
  box-shadow: 0 4px 14px rgba(0,0,0,.12); }
.gr-results:empty { display: none; }
.gr-results button { display: block; width: 100%; text-align: left; background: none;
  border: 0; color: inherit; padding: .25rem .4rem; border-radius: 3px; }
.gr-results button:hover, .gr-results button:focus { background: #eef3ff; }
.gr-results .gr-kind { display: inline-block; min-width: 5.5rem; color: var(--muted, #5b6475); }
.gr-results .gr-where { color: var(--muted, #5b6475); font-size: .9em; }
.gr-layout { display: grid; grid-template-columns: minmax(0, 1fr) 24rem; gap: 1rem;
  align-items: start; }
.gr-layout.gr-nopanel { grid-template-columns: minmax(0, 1fr); }
.gr-box { position: relative; background: #fff; border: 1px solid var(--line, #dde1ea);
  border-radius: 6px; height: calc(100vh - 17rem); min-height: 22rem; overflow: hidden; }
.gr-box svg { width: 100%; height: 100%; display: block; cursor: grab; touch-action: none; }
.gr-box svg.gr-dragging { cursor: grabbing; }
.gr-zoom { position: absolute; right: .5rem; top: .5rem; display: flex; gap: .25rem; z-index: 2; }
.gr-zoom button { padding: .1rem .55rem; min-width: 2rem; }
.gr-status { position: absolute; left: 50%; top: 40%; transform: translate(-50%, -50%);
  background: rgba(255,255,255,.95); padding: .6rem 1rem; border: 1px solid var(--line, #dde1ea);
  border-radius: 6px; text-align: center; z-index: 3; }
.gr-status[hidden] { display: none; }
.gr-status progress { width: 14rem; display: block; margin: .3rem auto 0; }
.gr-legend { display: flex; flex-wrap: wrap; gap: .3rem 1.1rem; list-style: none; padding: 0;
  margin: 0 0 .4rem; font-size: .92em; }
.gr-legend li { display: flex; align-items: center; gap: .35rem; }
.gr-swatch { width: .9rem; height: .9rem; border-radius: 3px; display: inline-block; }
.gr-folded-note { margin: 0 0 .5rem; }
.gr-node { cursor: pointer; }
.gr-node:focus { outline: none; }
.gr-node .gr-body { fill: #fff; stroke-width: 1.5; }
.gr-node:hover .gr-body { fill: #f4f7ff; }
.gr-node:focus-visible .gr-body, .gr-node.gr-selected .gr-body { stroke: #f0a020 !important;
  stroke-width: 3; }
.gr-node.gr-hit .gr-body { stroke: #f0a020 !important; stroke-width: 3; }
.gr-node.gr-fallback .gr-body { stroke: #b3261e !important; stroke-dasharray: 5 3;
  stroke-width: 2.2; }
.gr-node .gr-title { font: 600 12px system-ui, sans-serif; fill: #1d2330; }
.gr-node .gr-sub { font: 11px system-ui, sans-serif; fill: #5b6475; }
.gr-node .gr-fb { font: 600 11px system-ui, sans-serif; fill: #b3261e; }
.gr-node .gr-repeat { font: 700 12px system-ui, sans-serif; fill: #fff; }
.gr-stack { stroke: #8b93a5; fill: #fff; }
.gr-edge { fill: none; stroke: #8b93a5; stroke-width: 1.3; }
.gr-edge.gr-comm { stroke: #e45756; stroke-width: 1.8; }
.gr-edge.gr-boundary { stroke-dasharray: 4 3; stroke: #b9c0cf; }
.gr-edge-hit { fill: none; stroke: transparent; stroke-width: 10; cursor: pointer; }
.gr-elabel { cursor: pointer; }
.gr-elabel:focus { outline: none; }
.gr-elabel rect { fill: #fff; stroke: #dde1ea; }
.gr-elabel:focus-visible rect, .gr-elabel.gr-selected rect { stroke: #f0a020; stroke-width: 2; }
.gr-elabel text { font: 11px ui-monospace, monospace; fill: #1d2330; }
.gr-badge { cursor: pointer; }
.gr-badge:focus { outline: none; }
.gr-badge rect { fill: #e45756; }
.gr-badge text { font: 600 10.5px system-ui, sans-serif; fill: #fff; }
.gr-badge:focus-visible rect, .gr-badge.gr-selected rect { stroke: #f0a020; stroke-width: 2.5; }
.gr-port rect { fill: #f3f4f8; stroke: #b9c0cf; stroke-dasharray: 4 3; }
.gr-port text { font: 11px system-ui, sans-serif; fill: #5b6475; }
.gr-panel { max-height: calc(100vh - 14rem); }
.gr-panel h2 { margin-top: 0; word-break: break-all; }
.gr-panel .gr-close { float: right; margin-left: .5rem; }
.gr-panel table { width: 100%; font-size: .9em; }
.gr-panel td, .gr-panel th { padding: .2rem .35rem; }
.gr-panel code, .gr-panel .gr-mono { font: 12px ui-monospace, monospace; word-break: break-all; }
.gr-panel .gr-reason { white-space: pre-wrap; background: #f6f7fb; padding: .4rem .5rem;
  border-radius: 4px; font-size: .92em; }
.gr-panel button.gr-link { background: none; border: 0; color: var(--accent, #2f5fd0);
  padding: 0; text-decoration: underline; text-align: left; word-break: break-all; }
.gr-panel ul { padding-left: 1.1rem; }
.gr-fallback-text { color: #b3261e; font-weight: 600; }
`;

function injectStyle() {
  if (document.getElementById("graph-view-style")) return;
  document.head.append(h("style", { id: "graph-view-style" }, STYLE));
}

/** An SVG element: svg("rect", {x: 1}, child, ...). */
function svg(tag, attrs = {}, ...children) {
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

const measureCanvas = document.createElement("canvas").getContext("2d");
function textWidth(text, font = FONT) {
  measureCanvas.font = font;
  return measureCanvas.measureText(text).width;
}

function shorten(text, font, max) {
  if (textWidth(text, font) <= max) return text;
  let lo = 0;
  let hi = text.length;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (textWidth(`…${text.slice(text.length - mid)}`, font) <= max) lo = mid; else hi = mid - 1;
  }
  return `…${text.slice(text.length - lo)}`;
}

function roleColor(role) {
  return ROLE_COLORS[role] ?? "#8b93a5";
}

function roleSwatch(role) {
  return h("span", { class: "gr-swatch", style: `background:${roleColor(role)}` });
}

function shape(list) {
  return list ? `[${list.join(", ")}]` : "–";
}

// -- node and edge geometry ------------------------------------------------------------------

function nodeSubtitle(node) {
  if (node.kind === "module") {
    const parts = [`${fmtInt(node.ops)} ops`];
    if (node.collectives) parts.push(`${fmtInt(node.collectives)} comm`);
    return parts.join(" · ");
  }
  return `${node.op_kind} · ${node.role}`;
}

function nodeSize(node) {
  const title = textWidth(node.label, "600 12px system-ui, sans-serif");
  const sub = textWidth(nodeSubtitle(node), SMALL) + (node.fallback ? 60 : 0);
  const extra = node.repeat > 1 ? 42 : 0;
  const width = Math.min(300, Math.max(110, Math.max(title, sub) + 30 + extra));
  return { width: Math.ceil(width), height: NODE_H };
}

function badgeGroups(collectives) {
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

function edgeLabelSize(edge, boundary) {
  const groups = badgeGroups(edge.collectives).slice(0, MAX_BADGES);
  const badgeW = groups.reduce((w, g) => w + textWidth(g.text, SMALL) + 14, 0);
  const specW = boundary ? 0 : textWidth(edge.label, SMALL) + 10;
  if (!groups.length) return { width: Math.ceil(specW), height: boundary ? 0 : 16 };
  return { width: Math.ceil(Math.max(specW, badgeW)), height: boundary ? 18 : 36 };
}

function pathOf(points) {
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

// -- the view --------------------------------------------------------------------------------

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
    transform: { x: 0, y: 0, k: 1 },
    selected: null, // {type: "op"|"value"|"collective"|"edge", name}
  };

  const crumbs = h("nav", { class: "gr-crumbs", "aria-label": "scope" });
  const searchInput = h("input", { id: "graph-search", type: "search", autocomplete: "off",
    placeholder: "e.g. q_proj, all_reduce, embed.weight" });
  const results = h("ul", { class: "gr-results", id: "graph-search-results",
    "aria-label": "search results" });
  const search = h("div", { class: "gr-search", role: "search" },
    h("label", { for: "graph-search" }, "Search ops and values"), searchInput, results);
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
    h("h1", {}, `Plan ${planId}: op graph`),
    planTabs(planId, "graph"),
    h("div", { class: "gr-bar" }, crumbs, search),
    foldedNote,
    layout,
  );

  // one worker for the view's lifetime
  const worker = new Worker("/graph_worker.js");
  const waiting = new Map();
  worker.onmessage = (event) => {
    const msg = event.data;
    const pending = waiting.get(msg.id);
    if (!pending) return;
    if (msg.type === "progress") {
      statusText.textContent = `${msg.stage}…`;
      statusBar.value = msg.fraction;
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
  ctx.signal.addEventListener("abort", () => worker.terminate());

  function layoutInWorker(id, nodes, edges) {
    return new Promise((resolve, reject) => {
      waiting.set(id, { resolve, reject });
      worker.postMessage({ id, nodes, edges, options: {} });
    });
  }

  // -- pan and zoom ------------------------------------------------------------------------

  function applyTransform() {
    const { x, y, k } = state.transform;
    viewport.setAttribute("transform", `translate(${x},${y}) scale(${k})`);
  }

  function zoomBy(factor, cx, cy) {
    const rect = canvas.getBoundingClientRect();
    const px = cx ?? rect.width / 2;
    const py = cy ?? rect.height / 2;
    const t = state.transform;
    const k = Math.min(4, Math.max(0.05, t.k * factor));
    t.x = px - ((px - t.x) * k) / t.k;
    t.y = py - ((py - t.y) * k) / t.k;
    t.k = k;
    applyTransform();
  }

  function fit(initial) {
    if (!state.layout) return;
    const rect = canvas.getBoundingClientRect();
    const { width, height } = state.layout;
    const k = Math.min(1, rect.width / width, rect.height / height);
    // a huge graph starts readable at the top, not as a speck
    const scale = initial ? Math.max(k, 0.45) : Math.max(k, 0.05);
    state.transform = {
      k: scale,
      x: (rect.width - width * scale) / 2,
      y: height * scale <= rect.height ? (rect.height - height * scale) / 2 : 8,
    };
    applyTransform();
  }

  canvas.addEventListener("wheel", (event) => {
    event.preventDefault();
    const rect = canvas.getBoundingClientRect();
    zoomBy(Math.exp(-event.deltaY * 0.0015), event.clientX - rect.left, event.clientY - rect.top);
  }, { passive: false });

  let drag = null;
  canvas.addEventListener("pointerdown", (event) => {
    if (event.button !== 0 || event.target.closest(".gr-node, .gr-elabel, .gr-badge, .gr-edge-hit")) {
      return;
    }
    drag = { x: event.clientX, y: event.clientY, tx: state.transform.x, ty: state.transform.y };
    canvas.setPointerCapture(event.pointerId);
    canvas.classList.add("gr-dragging");
  });
  canvas.addEventListener("pointermove", (event) => {
    if (!drag) return;
    state.transform.x = drag.tx + event.clientX - drag.x;
    state.transform.y = drag.ty + event.clientY - drag.y;
    applyTransform();
  });
  const endDrag = () => { drag = null; canvas.classList.remove("gr-dragging"); };
  canvas.addEventListener("pointerup", endDrag);
  canvas.addEventListener("pointercancel", endDrag);

  // -- breadcrumb and search ---------------------------------------------------------------

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

  let searchTimer = null;
  let searchSeq = 0;
  searchInput.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(runSearch, 200);
  });
  searchInput.addEventListener("keydown", (event) => {
    if (event.key === "Enter") { event.preventDefault(); clearTimeout(searchTimer); runSearch(); }
    if (event.key === "Escape") results.replaceChildren();
    if (event.key === "ArrowDown") results.querySelector("button")?.focus();
  });
  results.addEventListener("keydown", (event) => {
    const buttons = [...results.querySelectorAll("button")];
    const at = buttons.indexOf(document.activeElement);
    if (event.key === "ArrowDown" && at < buttons.length - 1) buttons[at + 1].focus();
    else if (event.key === "ArrowUp") (at > 0 ? buttons[at - 1] : searchInput).focus();
    else if (event.key === "Escape") { results.replaceChildren(); searchInput.focus(); }
    else return;
    event.preventDefault();
  });

  const closeResults = (event) => {
    if (!search.contains(event.target)) results.replaceChildren();
  };
  document.addEventListener("pointerdown", closeResults);
  ctx.signal.addEventListener("abort", () => {
    document.removeEventListener("pointerdown", closeResults);
    clearTimeout(searchTimer);
  });

  async function runSearch() {
    const q = searchInput.value.trim();
    const seq = ++searchSeq;
    if (!q) { results.replaceChildren(); return; }
    try {
      const found = await api(`${base}/graph/search?q=${encodeURIComponent(q)}`);
      if (seq !== searchSeq || ctx.signal.aborted) return;
      if (!found.results.length) {
        results.replaceChildren(h("li", { class: "muted" }, `nothing matches “${q}”`));
        return;
      }
      results.replaceChildren(...found.results.map((r) => h("li", {}, h("button", {
        type: "button",
        onclick: () => openHit(r),
      }, h("span", { class: "gr-kind" }, r.kind), h("span", { class: "gr-mono" }, r.name), " ",
      h("span", { class: "gr-where" }, `${r.detail ?? ""} · in ${r.scope || "root"}`)))));
    } catch (err) {
      if (seq === searchSeq) results.replaceChildren(h("li", {}, errorBox(err)));
    }
  }

  async function openHit(hit) {
    results.replaceChildren();
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
    const { nodes, edges } = geometry(view);
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
    draw(view, placed);
    fit(true);
    status.hidden = true;
    canvas.setAttribute("data-layout-ms", placed.ms.toFixed(1));
    canvas.setAttribute("data-state", "ready");
    performance.mark("graph:drawn");
    markSelected();
  }

  // Data flowing to a node that starts earlier in program order (gradients going back to
  // the module of their forward op) is laid out as a reversed edge, so the forward pass reads
  // top-down and the backward pass climbs back up; `draw` turns its points around.
  function geometry(view) {
    const nodes = view.nodes.map((n) => ({ id: n.id, ...nodeSize(n) }));
    const order = new Map(view.nodes.map((n) => [n.id, n.order]));
    const edges = view.edges.map((e) => {
      const back = order.get(e.target) < order.get(e.source);
      return {
        id: e.id, source: back ? e.target : e.source, target: back ? e.source : e.target,
        ...edgeLabelSize(e, false), weight: back ? 1 : 2,
      };
    });
    state.reversed = new Set(edges.filter((e, i) => e.source !== view.edges[i].source)
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
    return { nodes, edges };
  }

  function draw(view, placed) {
    const nodeLayer = svg("g", { class: "gr-nodes" });
    const edgeLayer = svg("g", { class: "gr-edges" });
    const labelLayer = svg("g", { class: "gr-labels" });

    for (const node of view.nodes) {
      const at = placed.nodes[node.id];
      if (at) nodeLayer.append(drawNode(node, at));
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
      const points = state.reversed?.has(edge.id) ? [...at.points].reverse() : at.points;
      const d = pathOf(points);
      const cls = `gr-edge${comm ? " gr-comm" : ""}${edge.boundary ? " gr-boundary" : ""}`;
      edgeLayer.append(svg("path", { class: cls, d,
        "marker-end": `url(#${comm ? "gr-arrow-comm" : "gr-arrow"})` }));
      edgeLayer.append(svg("path", { class: "gr-edge-hit", d, "data-edge": edge.id,
        onclick: () => selectEdge(edge) }, svg("title", {}, edgeTitle(edge))));
      const label = drawEdgeLabel(edge, at);
      if (label) labelLayer.append(label);
    }
    viewport.replaceChildren(nodeLayer, edgeLayer, labelLayer);
  }

  function drawNode(node, at) {
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
    const activate = () => {
      performance.mark("graph:click");
      return expandable ? openScope(node.expand) : selectOp(node);
    };
    g.addEventListener("click", activate);
    g.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); activate(); }
    });
    return g;
  }

  function edgeTitle(edge) {
    const values = edge.values.map((v) => `${v.value}: ${v.spec ?? "?"}`).join("\n");
    const more = edge.count > edge.values.length ? `\n… ${edge.count - edge.values.length} more` : "";
    return `${values}${more}`;
  }

  function drawEdgeLabel(edge, at) {
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
      label.addEventListener("click", () => selectEdge(edge));
      label.addEventListener("keydown", (event) => {
        if (event.key === "Enter" || event.key === " ") { event.preventDefault(); selectEdge(edge); }
      });
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
      const open = () => (group.items.length === 1 && groups.length <= MAX_BADGES
        ? selectCollective(first.name)
        : selectEdge(edge));
      badge.addEventListener("click", open);
      badge.addEventListener("keydown", (event) => {
        if (event.key === "Enter" || event.key === " ") { event.preventDefault(); open(); }
      });
      g.append(badge);
      x += w + 2;
    });
    return g;
  }

  function markSelected() {
    for (const el of viewport.querySelectorAll(".gr-selected")) el.classList.remove("gr-selected");
    const sel = state.selected;
    if (!sel) return;
    const css = (value) => CSS.escape(value);
    if (sel.type === "op") {
      viewport.querySelector(`.gr-node[data-id="${css(sel.name)}"]`)?.classList.add("gr-selected");
    } else if (sel.type === "collective") {
      viewport.querySelector(`.gr-badge[data-collective="${css(sel.name)}"]`)
        ?.classList.add("gr-selected");
    } else if (sel.type === "edge") {
      viewport.querySelector(`.gr-elabel[data-edge="${css(sel.name)}"]`)
        ?.classList.add("gr-selected");
    }
  }

  // -- the side panel ----------------------------------------------------------------------

  function openPanel(...content) {
    panel.hidden = false;
    layout.classList.remove("gr-nopanel");
    for (const key of ["data-op", "data-value", "data-collective", "data-complete"]) {
      panel.removeAttribute(key);
    }
    panel.replaceChildren(
      h("button", { type: "button", class: "secondary gr-close", "aria-label": "Close details",
        onclick: closePanel }, "Close"),
      ...content.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  }

  function closePanel() {
    panel.hidden = true;
    layout.classList.add("gr-nopanel");
    panel.replaceChildren();
    state.selected = null;
    ctx.setQuery(selectionQuery());
    markSelected();
  }

  function select(sel) {
    state.selected = sel;
    ctx.setQuery(selectionQuery());
    markSelected();
  }

  function showSelection() {
    const sel = state.selected;
    if (!sel) return;
    if (sel.type === "op") selectOp(null, sel.name);
    else if (sel.type === "value") selectValue(sel.name);
    else if (sel.type === "collective") selectCollective(sel.name);
  }

  function valueButton(value, label = value) {
    return h("button", { type: "button", class: "gr-link gr-mono",
      onclick: () => selectValue(value) }, label);
  }

  function portsTable(title, ports) {
    if (!ports.length) return null;
    return [
      h("h3", {}, title),
      h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "value"), h("th", {}, "spec"),
        h("th", {}, "shape"), h("th", {}, "per rank"))),
      h("tbody", {}, ports.map((p) => h("tr", {},
        h("td", {}, valueButton(p.value, p.name)),
        h("td", { class: "gr-mono" }, p.spec ?? "–"),
        h("td", { class: "gr-mono" }, p.shape === undefined ? "…" : shape(p.shape)),
        h("td", { class: "gr-mono" }, p.local_shape === undefined ? "…" : shape(p.local_shape)))))),
    ];
  }

  function opPanel(info, complete) {
    const folded = state.view?.folded;
    openPanel(
      h("h2", {}, info.name),
      h("dl", {},
        h("dt", {}, "kind"), h("dd", { class: "gr-mono" }, info.kind),
        h("dt", {}, "role"), h("dd", {}, roleSwatch(info.role), " ", info.role),
        h("dt", {}, "scope"), h("dd", { class: "gr-mono" }, info.scope || "(none)"),
        info.shown_in !== info.scope ? [h("dt", {}, "shown in"),
          h("dd", { class: "gr-mono" }, info.shown_in || "root")] : null,
        h("dt", {}, "stream"), h("dd", {}, info.stream),
        info.time_s !== null && info.time_s !== undefined
          ? [h("dt", {}, "time"), h("dd", {}, fmtTime(info.time_s))] : null,
        info.fallback ? [h("dt", {}, "fallback"), h("dd", { class: "gr-fallback-text" },
          "no sharding rule: every rank computes it on replicated inputs")] : null),
      folded && folded.representative && info.shown_in.startsWith(folded.scope)
        ? h("p", { class: "muted" }, `One of ${folded.repeat} repeats (${folded.members}).`)
        : null,
      h("h3", {}, "Why this placement (the rule's reason)"),
      h("p", { class: "gr-reason" }, info.reason || "–"),
      portsTable("Inputs", info.inputs),
      portsTable("Outputs", info.outputs),
      complete ? null : h("p", { class: "muted loading" }, "loading shapes…"),
    );
    panel.setAttribute("data-op", info.name);
    panel.toggleAttribute("data-complete", complete);
    performance.mark(complete ? "graph:panel-complete" : "graph:panel");
  }

  async function selectOp(node, name = node.id) {
    select({ type: "op", name });
    if (node?.op) opPanel(node.op, false);
    else openPanel(h("h2", {}, name), h("p", { class: "loading" }, "loading…"));
    try {
      const detail = await api(`${base}/graph/ops/${encodeURIComponent(name)}`);
      if (state.selected?.type !== "op" || state.selected.name !== name) return;
      opPanel(detail, true);
    } catch (err) {
      if (state.selected?.name === name) openPanel(h("h2", {}, name), errorBox(err));
    }
  }

  async function selectValue(value) {
    select({ type: "value", name: value });
    openPanel(h("h2", {}, value), h("p", { class: "loading" }, "loading…"));
    try {
      const placed = await api(`${base}/placements/${encodeURIComponent(value)}`);
      if (state.selected?.type !== "value" || state.selected.name !== value) return;
      openPanel(
        h("h2", {}, value),
        h("dl", {}, h("dt", {}, "spec"), h("dd", { class: "gr-mono" }, placed.spec)),
        h("h3", {}, "Decisions that set it"),
        h("ol", {}, placed.explanation.map((step) => h("li", {},
          h("span", { class: "gr-mono" }, `${step.value}: ${step.spec}`),
          step.decisions.length
            ? h("ul", {}, step.decisions.map((d) => h("li", {},
              h("strong", {}, d.source), ": ", d.detail)))
            : h("p", { class: "muted" }, "no decision recorded"),
          step.because_of
            ? h("p", {}, "because of input ", valueButton(step.because_of)) : null))),
        placed.reshards.length ? [
          h("h3", {}, "Resharded for"),
          h("ul", {}, placed.reshards.map((r) => h("li", {},
            h("span", { class: "gr-mono" }, r.op), `: needs ${r.need}, arrives as ${r.have}`))),
        ] : null,
      );
      panel.setAttribute("data-value", value);
    } catch (err) {
      if (state.selected?.name !== value) return;
      const missing = err instanceof ApiError && err.status === 404;
      openPanel(h("h2", {}, value), missing
        ? h("p", {}, "No placement is recorded for this value: a pass created it (a gradient " +
          "bucket, a pipeline buffer); the ops reading and writing it say how it is laid out.")
        : errorBox(err));
    }
  }

  async function selectCollective(name) {
    select({ type: "collective", name });
    openPanel(h("h2", {}, name), h("p", { class: "loading" }, "loading…"));
    try {
      const c = await api(`${base}/collectives/${encodeURIComponent(name)}`);
      if (state.selected?.type !== "collective" || state.selected.name !== name) return;
      openPanel(
        h("h2", {}, name),
        h("dl", {},
          h("dt", {}, "kind"), h("dd", {}, c.kind),
          h("dt", {}, "mesh axes"), h("dd", {}, c.axes.join(", ")),
          h("dt", {}, "bytes per rank"), h("dd", {}, fmtBytes(c.bytes_per_rank)),
          h("dt", {}, "time"), h("dd", {}, c.time_s === null || c.time_s === undefined
            ? "not costed" : fmtTime(c.time_s)),
          h("dt", {}, "value"), h("dd", {}, valueButton(c.value)),
          h("dt", {}, "from"), h("dd", { class: "gr-mono" }, c.from),
          h("dt", {}, "to"), h("dd", { class: "gr-mono" }, c.to),
          h("dt", {}, "consumer"), h("dd", { class: "gr-mono" }, c.consumer),
          h("dt", {}, "scope"), h("dd", { class: "gr-mono" }, c.scope || "root"),
          h("dt", {}, "stream"), h("dd", {}, c.stream)),
        h("h3", {}, "Why it exists"),
        h("p", { class: "gr-reason" }, c.reason),
      );
      panel.setAttribute("data-collective", name);
    } catch (err) {
      if (state.selected?.name === name) openPanel(h("h2", {}, name), errorBox(err));
    }
  }

  function selectEdge(edge) {
    const groups = badgeGroups(edge.collectives);
    if (edge.count === 1 && !groups.length) {
      selectValue(edge.values[0].value);
      return;
    }
    select({ type: "edge", name: edge.id });
    const from = edge.source ?? "outside";
    const to = edge.target ?? "outside";
    openPanel(
      h("h2", {}, `${from} → ${to}`),
      h("p", {}, `${fmtInt(edge.count)} value${edge.count > 1 ? "s" : ""}`,
        edge.count > edge.values.length ? ` (the first ${edge.values.length})` : "", ":"),
      h("ul", {}, edge.values.map((v) => h("li", {}, valueButton(v.value, v.name), " ",
        h("span", { class: "gr-mono muted" }, v.spec ?? "")))),
      edge.collectives.length ? [
        h("h3", {}, "Collectives on this edge"),
        h("ul", {}, edge.collectives.map((c) => h("li", {},
          h("button", { type: "button", class: "gr-link", onclick: () => selectCollective(c.name) },
            `${c.kind} on ${c.axes.join(", ")}`),
          h("span", { class: "muted" }, ` ${fmtBytes(c.bytes_per_rank)}/rank · ${c.from} → ${c.to}`)))),
      ] : null,
    );
  }

  // -- start -------------------------------------------------------------------------------

  const first = ["op", "value", "collective"].find((key) => ctx.query.get(key));
  if (first) state.selected = { type: first, name: ctx.query.get(first) };
  if (state.selected) showSelection();
  await loadScope();
}
