// Small DOM and formatting helpers shared by the views.

/** Create an element: h("a", {href: "#/x", class: "btn"}, "text", child, ...). Attributes
 * starting with "on" are event listeners; `null`/`false` attributes are skipped. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

/** 1536 -> "1.50 KiB". */
export function fmtBytes(bytes) {
  let value = Number(bytes);
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) { value /= 1024; unit += 1; }
  return `${value.toFixed(unit ? 2 : 0)} ${UNITS[unit]}`;
}

/** The ticks of a bytes axis from 0 to `top` bytes in one binary unit (the GiB of the
 * capacity's "74.51 GiB"): about `count` round steps, labelled "20 GiB", and the unit's name
 * and power of two for the axis title (Plotly markup). Plotly's own ticks would be decimal
 * ("80G"). */
export function binaryTicks(top, count = 6) {
  let unit = 0;
  while (top / 1024 ** unit >= 1024 && unit < UNITS.length - 1) unit += 1;
  const scale = 1024 ** unit;
  const raw = Math.max(top / scale, 1e-9) / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((x) => x >= raw);
  const values = [];
  for (let i = 0; i * step <= top / scale * (1 + 1e-9); i += 1) values.push(i * step);
  return {
    unit: UNITS[unit],
    title: unit ? `${UNITS[unit]} = 2<sup>${10 * unit}</sup> B` : "B",
    tickvals: values.map((v) => v * scale),
    ticktext: values.map((v) => `${Number(v.toFixed(3))} ${UNITS[unit]}`),
  };
}

/** Seconds -> "12.3 ms" / "45.6 µs" / "1.23 s". */
export function fmtTime(seconds) {
  const s = Number(seconds);
  if (!Number.isFinite(s)) return "–";
  const a = Math.abs(s);
  if (a >= 1) return `${s.toFixed(3)} s`;
  if (a >= 1e-3) return `${(s * 1e3).toFixed(2)} ms`;
  return `${(s * 1e6).toFixed(1)} µs`;
}

/** 0.4123 -> "41.2%". */
export function fmtPercent(fraction) {
  return Number.isFinite(fraction) ? `${(fraction * 100).toFixed(1)}%` : "–";
}

/** 1234567 -> "1,234,567". */
export function fmtInt(n) {
  return Number(n).toLocaleString("en-US");
}

/** Colours of op roles, used by the graph, timeline and legends alike. */
/** A list of ranks as people read it: `0–7` when contiguous, else `0, 2, 4`. */
export function ranksText(ranks) {
  if (ranks.length <= 1) return String(ranks[0] ?? "");
  const contiguous = ranks.every((r, i) => i === 0 || r === ranks[i - 1] + 1);
  return contiguous ? `${ranks[0]}–${ranks[ranks.length - 1]}` : ranks.join(", ");
}

/** Colours of the five memory categories (the API's labels). */
export const CATEGORY_COLORS = {
  parameters: "#4c78a8",
  gradients: "#f58518",
  "optimizer state": "#54a24b",
  activations: "#b279a2",
  buffers: "#e45756",
};

export const ROLE_COLORS = {
  forward: "#4c78a8",
  backward: "#f58518",
  optimizer: "#54a24b",
  comm: "#e45756",
  loss: "#b279a2",
};

/** A message box for an error (ApiError or any Error). */
export function errorBox(err) {
  const code = err.code ? h("code", {}, err.code) : null;
  return h("div", { class: "error", role: "alert" }, code, code ? " " : null, err.message);
}

/** Show a short notice in the status bar. */
export function toast(message) {
  const el = document.getElementById("toast");
  el.textContent = message;
  el.classList.add("shown");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => el.classList.remove("shown"), 4000);
}

/** The tab bar of a plan's views; `active` is one of the view names. */
export function planTabs(planId, active, query = "") {
  const tabs = [
    ["overview", `#/plans/${planId}`],
    ["graph", `#/plans/${planId}/graph`],
    ["sharding", `#/plans/${planId}/sharding`],
    ["timeline", `#/plans/${planId}/timeline`],
    ["memory", `#/plans/${planId}/memory`],
    ["passes", `#/plans/${planId}/passes`],
  ];
  return h("nav", { class: "tabs", "aria-label": `plan ${planId} views` },
    tabs.map(([name, href]) => h("a", {
      href: name === active && query ? `${href}?${query}` : href,
      "aria-current": name === active ? "page" : null,
    }, name)));
}

/** Plotly.js (4.8 MB), loaded the first time a chart needs it, so views without charts
 * (the op graph, the sharding diagram) never wait for it. */
export function plotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  plotly.loading ??= new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = "/vendor/plotly.min.js";
    script.onload = () => resolve(window.Plotly);
    script.onerror = () => {
      plotly.loading = null;
      reject(new Error("Plotly did not load (/vendor/plotly.min.js)"));
    };
    document.head.append(script);
  });
  return plotly.loading;
}

/** The pager under a paged list: "Plans 51–100 of 130" between the buttons to the pages
 * either side. `go(offset)` shows another page; `label` names the pager, `id` the range. */
export function pager({ noun, label, offset, count, total, size, go, id, newer = "Newer",
  older = "Older" }) {
  const button = (label, to, enabled) => h("button", { type: "button", class: "secondary",
    disabled: !enabled, onclick: () => go(to) }, label);
  return h("nav", { class: "pager", "aria-label": label },
    button(newer, Math.max(0, offset - size), offset > 0),
    h("span", { id }, `${noun} ${total ? offset + 1 : 0}–${offset + count} of ${total}`),
    button(older, offset + size, offset + count < total));
}
