// The timeline view's per-op-kind statistics: for each shown representative rank, a table of
// op kinds (count, total busy time, mean, share of the step), largest total first. Built from
// the `kinds` the timeline endpoint gives each rank over its whole step (the bars it draws may
// be merged across kinds, or cut to a zoom window).
import { fmtInt, fmtPercent, fmtTime, h, ranksText } from "../ui.js";

/** "for ranks 0–63", or "for rank 3" when a rank stands for itself alone. */
export function standsFor(rank) {
  const ranks = rank.stands_for ?? [rank.rank];
  return ranks.length === 1 ? `for rank ${ranks[0]}` : `for ranks ${ranksText(ranks)}`;
}

/** The table of one rank: `rank` is an entry of the timeline's `ranks`. */
function kindTable(rank, step) {
  const kinds = rank.kinds ?? [];
  const busy = kinds.reduce((sum, k) => sum + k.busy_s, 0);
  return h("table", { class: "kind-stats", "data-rank": rank.rank,
    "data-busy-fraction": step > 0 ? busy / step : 0,
    "aria-label": `op kinds of representative ${rank.rank}` },
  h("caption", {}, `rank ${rank.rank} (${standsFor(rank)})`),
  h("thead", {}, h("tr", {}, ["Op kind", "Stream", "Count", "Total", "Mean", "Share of step"]
    .map((t, i) => h("th", { class: i > 1 ? "num" : null }, t)))),
  h("tbody", {}, kinds.map((k) => h("tr", { "data-kind": k.kind },
    h("td", {}, h("code", {}, k.kind)),
    h("td", { class: "muted" }, k.streams.join(", ")),
    h("td", { class: "num" }, fmtInt(k.count)),
    h("td", { class: "num", "data-seconds": k.busy_s }, fmtTime(k.busy_s)),
    h("td", { class: "num" }, fmtTime(k.count ? k.busy_s / k.count : 0)),
    h("td", { class: "num", "data-share": step > 0 ? k.busy_s / step : 0 },
      fmtPercent(step > 0 ? k.busy_s / step : 0))))));
}

/** The section: a heading, a note on what the shares mean, one table per shown rank. */
export function kindStats(data) {
  return h("section", { id: "kind-stats", "aria-label": "time per op kind" },
    h("h2", {}, "Time per op kind"),
    h("p", { class: "muted" }, `Busy time of each op kind over the whole step of stage `
      + `${data.stage}; shares are of the step time (${fmtTime(data.step_time_s)}), and sum `
      + "over all streams, so they can add up to more than 100% where streams overlap."),
    h("div", { class: "kind-stats-tables" },
      data.ranks.map((rank) => kindTable(rank, data.step_time_s))));
}
