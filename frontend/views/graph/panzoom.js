// Pan and zoom of the graph's SVG: the wheel zooms around the pointer, dragging the background
// pans (a drag never starts on a node, label, badge or edge, so those stay clickable), and
// the view's zoom buttons call `zoomBy` and `fit`. The transform lives here, applied to the
// `viewport` group inside `canvas`; `layoutOf()` gives the current layout ({width, height},
// or null while none is drawn) for `fit`.

export function panZoom(canvas, viewport, layoutOf) {
  let transform = { x: 0, y: 0, k: 1 };

  function applyTransform() {
    const { x, y, k } = transform;
    viewport.setAttribute("transform", `translate(${x},${y}) scale(${k})`);
  }

  /** Zoom by `factor` around (cx, cy) in the canvas, its centre by default. */
  function zoomBy(factor, cx, cy) {
    const rect = canvas.getBoundingClientRect();
    const px = cx ?? rect.width / 2;
    const py = cy ?? rect.height / 2;
    const t = transform;
    const k = Math.min(4, Math.max(0.05, t.k * factor));
    t.x = px - ((px - t.x) * k) / t.k;
    t.y = py - ((py - t.y) * k) / t.k;
    t.k = k;
    applyTransform();
  }

  /** Fit the whole layout in the canvas; `initial` when a scope has just been drawn. */
  function fit(initial) {
    const layout = layoutOf();
    if (!layout) return;
    const rect = canvas.getBoundingClientRect();
    const { width, height } = layout;
    const k = Math.min(1, rect.width / width, rect.height / height);
    // a huge graph starts readable at the top, not as a speck
    const scale = initial ? Math.max(k, 0.45) : Math.max(k, 0.05);
    transform = {
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
    drag = { x: event.clientX, y: event.clientY, tx: transform.x, ty: transform.y };
    canvas.setPointerCapture(event.pointerId);
    canvas.classList.add("gr-dragging");
  });
  canvas.addEventListener("pointermove", (event) => {
    if (!drag) return;
    transform.x = drag.tx + event.clientX - drag.x;
    transform.y = drag.ty + event.clientY - drag.y;
    applyTransform();
  });
  const endDrag = () => { drag = null; canvas.classList.remove("gr-dragging"); };
  canvas.addEventListener("pointerup", endDrag);
  canvas.addEventListener("pointercancel", endDrag);

  return { zoomBy, fit };
}
