// The SVG element helper of the diagrams drawn by hand (the sharding views).

const SVG_NS = "http://www.w3.org/2000/svg";

/** An SVG element: s("rect", {x: 1}, child, ...); `null`/`undefined` attributes skipped. */
export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined) continue;
    el.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

let context = null;

/** The width in pixels of `text` drawn in the CSS `font` ("600 11px system-ui"). */
export function textWidth(text, font) {
  context ??= document.createElement("canvas").getContext("2d");
  context.font = font;
  return context.measureText(text).width;
}
