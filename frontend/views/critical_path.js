// The timeline view's two overlays, computed in the browser from the events it fetched (their
// start, end, stream and deps; bars the API merged carry no deps, so both need single ops):
// the critical path, the chain of ops that gates the end of each shown rank's step (each op's
// latest-ending dependency or the op before it on its stream), outlined; and arrows from each
// asynchronous collective to the first op on another stream that depends on it (its wait).

const CRITICAL = "#111";
/** At most this many arrows: Plotly annotations are slow in the hundreds. */
const MAX_FLOWS = 150;

/** The y row of an event, as the timeline names its lanes. */
function rowOf(e) {
  return `rank ${e.rank} · ${e.stream}`;
}

/** The events of one rank, by name; and each event's previous one on its stream. */
function index(events) {
  const byName = new Map(events.map((e) => [e.name, e]));
  const prev = new Map();
  const lanes = new Map();
  for (const e of [...events].sort((a, b) => a.start - b.start || a.end - b.end)) {
    const lane = lanes.get(e.stream);
    if (lane) prev.set(e, lane);
    lanes.set(e.stream, e);
  }
  return { byName, prev };
}

/** The critical path of each rank: from its last-ending op back, each op's gating
 * predecessor (the latest-ending of its deps and its stream predecessor). In step order. */
export function criticalPath(data) {
  const out = [];
  for (const { rank } of data.ranks) {
    const events = data.events.filter((e) => e.rank === rank);
    if (!events.length) continue;
    const { byName, prev } = index(events);
    let e = events.reduce((a, b) => (b.end > a.end || (b.end === a.end && b.start > a.start) ? b : a));
    const seen = new Set();
    const chain = [];
    while (e && !seen.has(e)) {
      seen.add(e);
      chain.push(e);
      const before = (e.deps ?? []).map((d) => byName.get(d)).filter(Boolean);
      if (prev.has(e)) before.push(prev.get(e));
      e = before.filter((b) => b.end <= e.start + 1e-12)
        .reduce((a, b) => (a === null || b.end > a.end ? b : a), null);
    }
    out.push(...chain.reverse());
  }
  return out;
}

/** The outlined bars of the critical path: one Plotly trace. */
export function criticalTrace(chain) {
  return {
    type: "bar", orientation: "h", name: "critical path",
    y: chain.map(rowOf), base: chain.map((e) => e.start * 1e3),
    x: chain.map((e) => Math.max((e.end - e.start) * 1e3, 0)),
    hovertext: chain.map((e) => `<b>${String(e.name).replace(/</g, "&lt;")}</b> (critical path)`),
    hoverinfo: "text", width: 0.95,
    marker: { color: "rgba(0,0,0,0)", line: { color: CRITICAL, width: 2.5 } },
  };
}

/** Async collective -> the first op on another stream of its rank that depends on it. */
export function flows(data) {
  const out = [];
  for (const { rank } of data.ranks) {
    const events = data.events.filter((e) => e.rank === rank);
    const waiter = new Map(); // comm op name -> earliest dependent on another stream
    for (const e of events) {
      for (const d of e.deps ?? []) {
        const w = waiter.get(d);
        if (!w || e.start < w.start) waiter.set(d, e);
      }
    }
    for (const e of events) {
      const w = waiter.get(e.name);
      if (e.stream !== "compute" && w && w.stream !== e.stream) out.push({ from: e, to: w });
    }
  }
  return out.slice(0, MAX_FLOWS);
}

/** Plotly annotations: an arrow from each collective's end to its wait's start. `rows` are
 * the y axis's categories in order (annotations on a category axis take their index). */
export function flowAnnotations(pairs, rows) {
  return pairs.map(({ from, to }) => ({
    x: to.start * 1e3, y: rows.indexOf(rowOf(to)), xref: "x", yref: "y",
    ax: from.end * 1e3, ay: rows.indexOf(rowOf(from)), axref: "x", ayref: "y",
    showarrow: true, arrowhead: 2, arrowsize: 1, arrowwidth: 1.2, arrowcolor: "#444",
    opacity: 0.8, text: "", captureevents: false,
    name: `${from.name} -> ${to.name}`,
  }));
}
