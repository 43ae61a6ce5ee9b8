// Form helpers of the models, plan and compare views: labelled controls, and API errors shown
// next to the field they concern (aria-invalid + aria-describedby), not only as a banner.
import { errorBox, h } from "./ui.js";

let counter = 0;

/** A page-unique element id: uid("preset") -> "preset-3". */
export function uid(prefix) {
  counter += 1;
  return `${prefix}-${counter}`;
}

/** The request field an API error concerns: `detail.errors[0].loc` ("body.overrides.heads"
 * -> "overrides", "query.name" -> "name") or `detail.field`; null when it names none. */
export function fieldOf(err) {
  const loc = err?.detail?.errors?.[0]?.loc ?? err?.detail?.field ?? "";
  return String(loc).replace(/^(body|query|path)\./, "").split(".")[0] || null;
}

/** A field's error line (hidden while empty); its id goes into the controls'
 * aria-describedby when an error is shown. */
export function errorLine(prefix) {
  return h("p", { class: "field-error", id: uid(`${prefix}-error`), hidden: true });
}

function describedBy(el, id, on) {
  const ids = new Set((el.getAttribute("aria-describedby") ?? "").split(/\s+/).filter(Boolean));
  if (on) ids.add(id);
  else ids.delete(id);
  if (ids.size) el.setAttribute("aria-describedby", [...ids].join(" "));
  else el.removeAttribute("aria-describedby");
}

/** A field that can show an error: its controls (inputs, selects, textareas) and error line. */
export class Field {
  constructor(controls, line) {
    this.controls = controls;
    this.line = line;
  }

  /** Show `message` under the field and mark `only` (default: every control) invalid. */
  show(message, only = null) {
    this.line.textContent = message;
    this.line.hidden = false;
    for (const el of only ?? this.controls()) {
      el.setAttribute("aria-invalid", "true");
      describedBy(el, this.line.id, true);
    }
  }

  clear() {
    this.line.textContent = "";
    this.line.hidden = true;
    for (const el of this.controls()) {
      el.removeAttribute("aria-invalid");
      describedBy(el, this.line.id, false);
    }
  }

  /** The first control marked invalid (to move the focus there). */
  firstInvalid() {
    return this.controls().find((el) => el.getAttribute("aria-invalid") === "true") ?? null;
  }
}

/** A Field over a fixed list of controls. */
export function field(prefix, ...controls) {
  return new Field(() => controls, errorLine(prefix));
}

/** Show `err` on the field `fields[name]` when `name` is one; otherwise in `banner` (an
 * element the view keeps for errors that concern no one field). Focuses the invalid control. */
export function showError(err, name, fields, banner, only = null) {
  const target = name ? fields[name] : null;
  if (target) {
    target.show(err.message, only);
    target.firstInvalid()?.focus();
  } else {
    banner.replaceChildren(errorBox(err));
  }
}

/** Clear every field's error and the banner. */
export function clearErrors(fields, banner) {
  for (const f of Object.values(fields)) f.clear();
  banner.replaceChildren();
}

/** `<label for=id>text</label>` followed by the control (which gets the id). */
export function labelled(text, control, ...after) {
  if (!control.id) control.id = uid("control");
  return [h("label", { for: control.id }, text), control, ...after];
}
