// The graph's side panel: the details of what is selected (an op, a value, a collective or an
// edge), fetched from the API, and the orange mark on the selected element of the drawing.
// `state.selected` ({type: "op"|"value"|"collective"|"edge", name}) is the one selection;
// every change of it is handed to `saveSelection()` so the view keeps the URL in step.
// `panel` is the <aside>, `layout` the grid around it (it loses `gr-nopanel` while the
// panel is open), `viewport` the SVG group the graph is drawn in.
import { api, ApiError } from "../../api.js";
import { errorBox, fmtBytes, fmtInt, fmtTime, h } from "../../ui.js";
import { roleSwatch } from "./draw.js";
import { badgeGroups } from "./geometry.js";

function shape(list) {
  return list ? `[${list.join(", ")}]` : "–";
}

export function sidePanel({ panel, layout, viewport, state, base, saveSelection }) {
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
    saveSelection();
    markSelected();
  }

  function select(sel) {
    state.selected = sel;
    saveSelection();
    markSelected();
  }

  /** Open the panel for `state.selected` as it stands (a permalink, a search hit). */
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

  // An op node carries a summary of its op, shown at once; the full detail (with shapes)
  // replaces it when it arrives, unless the selection has moved on meanwhile.
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

  // An edge with one value and no collective is just that value; otherwise the panel lists
  // its values and collectives, each a link to its own panel. Not kept in the URL.
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

  return { markSelected, showSelection, selectOp, selectValue, selectCollective, selectEdge };
}
