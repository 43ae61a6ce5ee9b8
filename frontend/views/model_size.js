// The batch size and sequence length fields of the new-plan form. They are overrides of the
// chosen model's preset (`batch`, `seq`): a plan with other values than the model's is made
// on the team's model of that preset with those overrides, reused when it exists, else
// created (POST /api/models) as "<model> batch=16 seq=512".
import { api, ApiError } from "../api.js";
import { field, labelled } from "../forms.js";
import { h } from "../ui.js";

const KEYS = ["batch", "seq"];

/** Overrides as a comparable text (keys sorted, numbers as numbers). */
function key(overrides) {
  return JSON.stringify(Object.keys(overrides ?? {}).sort()
    .map((k) => [k, /^\d+$/.test(String(overrides[k])) ? Number(overrides[k]) : overrides[k]]));
}

/** The two fields, prefilled from the URL (`batch`, `seq`); `models` is the team's list. */
export function modelSizePicker(query, models) {
  const inputs = Object.fromEntries(KEYS.map((k) => [k, h("input", { type: "number", min: 1,
    step: 1, style: "width: 7rem", value: query.get(k) || "", "data-override": k })]));
  const f = field("model-size", inputs.batch, inputs.seq);
  const note = h("span", { class: "muted" });
  const element = h("fieldset", {}, h("legend", {}, "Batch and sequence"),
    h("div", { style: "display: flex; gap: 1.2rem; align-items: flex-end; flex-wrap: wrap" },
      h("div", {}, ...labelled("Batch size (sequences per step)", inputs.batch)),
      h("div", {}, ...labelled("Sequence length (tokens)", inputs.seq)), note),
    f.line);

  /** Show the chosen model's own values as placeholders (its summary's config). */
  async function showModel(id) {
    const m = models.find((x) => String(x.id) === String(id));
    const preset = m?.source === "preset";
    for (const input of Object.values(inputs)) {
      input.disabled = !preset;
      input.placeholder = "";
    }
    note.textContent = preset ? "empty: the model's own" : "only for models made from a preset";
    if (!preset) return;
    try {
      const config = (await api(`/api/models/${m.id}`)).summary?.config ?? {};
      for (const k of KEYS) if (config[k] !== undefined) inputs[k].placeholder = `model: ${config[k]}`;
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
    }
  }

  /** The overrides the fields set ({} when empty). */
  function value() {
    const out = {};
    for (const k of KEYS) {
      const text = inputs[k].value.trim();
      if (text && !inputs[k].disabled) out[k] = Number(text);
    }
    return out;
  }

  /** The id of the model to plan: `id` itself, or the team's model of its preset with the
   * fields' overrides (found or created). API errors (a bad value) are thrown. */
  async function resolve(id) {
    const base = models.find((m) => m.id === id);
    const extra = value();
    if (!base || base.source !== "preset" || !Object.keys(extra).length) return id;
    const overrides = { ...(base.overrides ?? {}), ...extra };
    if (key(overrides) === key(base.overrides)) return id;
    const same = models.find((m) => m.source === "preset" && m.preset === base.preset
      && key(m.overrides) === key(overrides));
    if (same) return same.id;
    const name = `${base.name} ${Object.entries(extra).map(([k, v]) => `${k}=${v}`).join(" ")}`;
    for (let n = 1; ; n += 1) {
      try {
        const made = await api("/api/models", { method: "POST", body: {
          name: n === 1 ? name : `${name} (${n})`, preset: base.preset, overrides } });
        models.push(made);
        return made.id;
      } catch (err) {
        if (!(err instanceof ApiError && err.code === "conflict" && n < 50)) throw err;
      }
    }
  }

  return { field: f, element, showModel, resolve, value };
}
