// The graph's search box: ops, values, collectives and modules of the whole plan, whatever
// scope is shown. Typing searches after a pause (Enter at once); ArrowDown/ArrowUp walk the
// results, Escape or a click elsewhere closes them. Picking a result empties the list and
// calls `onHit(hit)` with the API's result ({kind, name, scope, detail}); the view decides
// what opening it means. Listeners on `document` and the pending timer go when `signal`
// aborts (the user left the view).
import { api } from "../../api.js";
import { errorBox, h } from "../../ui.js";

export function searchBox({ base, signal, onHit }) {
  const searchInput = h("input", { id: "graph-search", type: "search", autocomplete: "off",
    placeholder: "e.g. q_proj, all_reduce, embed.weight" });
  const results = h("ul", { class: "gr-results", id: "graph-search-results",
    "aria-label": "search results" });
  const search = h("div", { class: "gr-search", role: "search" },
    h("label", { for: "graph-search" }, "Search ops and values"), searchInput, results);

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
  signal.addEventListener("abort", () => {
    document.removeEventListener("pointerdown", closeResults);
    clearTimeout(searchTimer);
  });

  async function runSearch() {
    const q = searchInput.value.trim();
    const seq = ++searchSeq;
    if (!q) { results.replaceChildren(); return; }
    try {
      const found = await api(`${base}/graph/search?q=${encodeURIComponent(q)}`);
      if (seq !== searchSeq || signal.aborted) return;
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

  function openHit(hit) {
    results.replaceChildren();
    return onHit(hit);
  }

  return search;
}
