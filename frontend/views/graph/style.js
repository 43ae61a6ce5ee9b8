// The op graph view's CSS: one <style> element, added to <head> the first time the view is
// opened and kept there (a second visit finds it by id and adds nothing).
import { h } from "../../ui.js";

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

export function injectStyle() {
  if (document.getElementById("graph-view-style")) return;
  document.head.append(h("style", { id: "graph-view-style" }, STYLE));
}
