// The team's models: the table (with each model's summary on demand), a model from a preset
// with overrides, a model from an uploaded graph JSON file, and a model imported from a
// Hugging Face config.json (a worker job: its progress, then the model or its error).
import { api, ApiError, apiPage, followJob } from "../api.js";
import { clearErrors, field, fieldOf, labelled, showError } from "../forms.js";
import { errorBox, fmtBytes, fmtInt, h, pager, toast } from "../ui.js";

const SI = [[1e18, "E"], [1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];

/** 1.1247e15 -> "1.12 PFLOP" (the exact count goes in the cell's title). */
export function fmtFlops(n) {
  const value = Number(n);
  const [scale, prefix] = SI.find(([s]) => Math.abs(value) >= s) ?? [1, ""];
  return `${(value / scale).toFixed(prefix ? 2 : 0)} ${prefix}FLOP`;
}

/** `layers=2` lines (or a JSON object) -> {layers: 2}; throws naming the bad line. */
export function parseOverrides(text) {
  const trimmed = text.trim();
  if (!trimmed) return {};
  if (trimmed.startsWith("{")) {
    let parsed;
    try { parsed = JSON.parse(trimmed); } catch (err) { throw new Error(`invalid JSON: ${err.message}`); }
    if (typeof parsed !== "object" || Array.isArray(parsed) || parsed === null) {
      throw new Error("the overrides must be a JSON object");
    }
    return parsed;
  }
  const out = {};
  text.split("\n").forEach((raw, i) => {
    const line = raw.replace(/#.*/, "").trim();
    if (!line) return;
    const match = line.match(/^([A-Za-z_][\w.]*)\s*[=:]\s*(.+)$/);
    if (!match) throw new Error(`line ${i + 1}: '${line}' is not of the form key=value`);
    const [, key, value] = match;
    out[key] = /^-?\d[\d_]*$/.test(value) ? Number(value.replaceAll("_", ""))
      : /^-?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$/i.test(value) ? Number(value) : value;
  });
  return out;
}

/** The overrides line that sets `key` ("line 3 (heads=7)"), or "" when none does. */
function lineOf(text, key) {
  if (!key) return "";
  const lines = text.split("\n");
  const i = lines.findIndex((l) => l.replace(/#.*/, "").trim().match(/^([\w.]+)\s*[=:]/)?.[1] === key);
  return i < 0 ? "" : `line ${i + 1} (${lines[i].trim()}): `;
}

// -- the table ------------------------------------------------------------------------------

function summaryDetail(model) {
  const s = model.summary;
  const pairs = [
    ["parameters", fmtInt(s.params)], ["parameter bytes", fmtBytes(s.param_bytes)],
    ["FLOPs per forward", fmtInt(s.flops_forward)], ["layers", s.layers], ["ops", fmtInt(s.ops)],
    ["values", fmtInt(s.values)],
    ["inputs", Object.entries(s.inputs).map(([k, v]) => `${k}: ${v}`).join(", ")],
    ["outputs", s.outputs.join(", ")],
    ["config", Object.entries(s.config).map(([k, v]) => `${k}=${v}`).join(", ") || "–"],
    ["ops by kind", Object.entries(s.ops_by_kind).map(([k, v]) => `${k} ${v}`).join(", ")],
  ];
  return h("dl", { class: "summary" }, pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))]));
}

/** The name cell: a disclosure button whose summary opens in `detail`, a row of its own
 * under the model's row spanning every column, so that the columns keep their widths. */
function nameCell(model, detail) {
  const body = detail.querySelector(".model-detail-body");
  const button = h("button", { type: "button", class: "model-toggle", "aria-expanded": "false",
    "aria-controls": detail.id }, model.name);
  button.addEventListener("click", async () => {
    const open = button.getAttribute("aria-expanded") !== "true";
    button.setAttribute("aria-expanded", String(open));
    detail.hidden = !open;
    if (!open || detail.dataset.loaded) return;
    detail.dataset.loaded = "1";
    try {
      body.replaceChildren(summaryDetail(await api(`/api/models/${model.id}`)),
        h("p", {}, h("a", { href: `#/plans/new?model=${model.id}` }, `Plan ${model.name}`)));
    } catch (err) {
      body.replaceChildren(errorBox(err));
    }
  });
  return h("td", { class: "model-name" }, button);
}

const COLUMNS = 8;

/** A model's row and its (hidden) detail row under it. */
function modelRows(model) {
  const overrides = Object.entries(model.overrides ?? {}).map(([k, v]) => `${k}=${v}`).join(", ");
  const detail = h("tr", { class: "model-detail", id: `model-${model.id}-detail`, hidden: true,
    dataset: { detailOf: model.id } }, h("td", { colspan: COLUMNS },
    h("div", { class: "model-detail-body" }, h("p", { class: "loading" }, "loading…"))));
  const row = h("tr", { dataset: { modelId: model.id } },
    nameCell(model, detail),
    h("td", {}, model.source),
    h("td", {}, model.preset ?? "–"),
    h("td", { class: "model-overrides", title: overrides || null }, overrides || "–"),
    h("td", { class: "num", dataset: { col: "params" } }, fmtInt(model.params)),
    h("td", { class: "num", title: `${fmtInt(model.flops_forward)} FLOPs` }, fmtFlops(model.flops_forward)),
    h("td", { class: "num" }, String(model.layers)),
    h("td", { class: "num" }, fmtInt(model.ops)));
  return [row, detail];
}

/** Models per page. */
export const PAGE = 50;

/** Fill `holder` with a page of the team's models (oldest first) and its pager; with
 * `highlight` (a new model, the newest) the last page, with that row marked. `go(offset)`
 * records the page in the URL. */
async function fillTable(holder, { offset = 0, highlight = null, go = () => {} } = {}) {
  let page = await apiPage(`/api/models?limit=${PAGE}&offset=${offset}`);
  if (highlight !== null && !page.items.some((m) => m.id === highlight)) {
    offset = Math.floor((page.total - 1) / PAGE) * PAGE;
    page = await apiPage(`/api/models?limit=${PAGE}&offset=${offset}`);
    go(offset);
  }
  const models = page.items;
  if (!models.length && offset === 0) {
    holder.replaceChildren(h("p", { class: "muted" }, "No models yet: create one below."));
    return;
  }
  const head = ["Name", "Source", "Preset", "Overrides", "Parameters", "FLOPs / forward",
    "Layers", "Ops"];
  const pairs = models.map(modelRows);
  const rows = pairs.map(([row]) => row);
  const turn = (to) => { go(to); fillTable(holder, { offset: to, go }); };
  holder.replaceChildren(h("table", { "aria-label": "models", class: "models-table" },
    h("thead", {}, h("tr", {}, head.map((t, i) => h("th", { class: i > 3 ? "num" : null, scope: "col" }, t)))),
    h("tbody", {}, pairs.flat())),
  page.total > PAGE || offset > 0 ? pager({ noun: "Models", label: "model pages", offset,
    count: models.length, total: page.total, size: PAGE, go: turn, id: "models-range",
    newer: "Previous", older: "Next" }) : null);
  const row = rows.find((r) => r.dataset.modelId === String(highlight));
  if (row) {
    row.setAttribute("aria-current", "true");
    row.style.background = "#eef3ff";
  }
}

// -- create from a preset -------------------------------------------------------------------

function defaultsTable(detail) {
  return h("div", {},
    h("p", {}, `${detail.name} as is: ${fmtInt(detail.params)} parameters, `,
      `${detail.layers} layers, ${fmtFlops(detail.flops_forward)} per forward.`),
    h("table", { "aria-label": `default config of ${detail.name}` },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "setting"), h("th", { scope: "col" }, "default"))),
      h("tbody", {}, Object.entries(detail.config).map(([k, v]) =>
        h("tr", {}, h("td", {}, h("code", {}, k)), h("td", {}, String(v)))))));
}

function presetForm(presets, onCreated) {
  const preset = h("select", { name: "preset" },
    presets.map((p) => h("option", { value: p.name }, `${p.name} — ${p.description}`)));
  const name = h("input", { name: "name", autocomplete: "off", placeholder: "e.g. llama3-8b-2l" });
  const hint = h("p", { class: "muted", id: "overrides-hint" },
    "One key=value per line (or a JSON object), e.g. layers=2. Empty: the preset as is.");
  const overrides = h("textarea", { name: "overrides", rows: 5, cols: 40, spellcheck: "false",
    "aria-describedby": hint.id });
  const defaults = h("div", { class: "defaults", "aria-live": "polite" });
  const banner = h("div");
  const fields = { preset: field("preset", preset), name: field("name", name),
    overrides: field("overrides", overrides) };
  const submit = h("button", { type: "submit" }, "Create model");

  async function showDefaults() {
    defaults.replaceChildren(h("p", { class: "loading" }, "loading…"));
    try {
      defaults.replaceChildren(defaultsTable(await api(`/api/presets/${encodeURIComponent(preset.value)}`)));
    } catch (err) {
      defaults.replaceChildren(errorBox(err));
    }
  }
  preset.addEventListener("change", showDefaults);

  async function onSubmit(event) {
    event.preventDefault();
    clearErrors(fields, banner);
    let parsed;
    try {
      parsed = parseOverrides(overrides.value);
    } catch (err) {
      showError(err, "overrides", fields, banner);
      return;
    }
    submit.disabled = true;
    try {
      const body = { name: name.value.trim(), preset: preset.value, overrides: parsed };
      const made = await api("/api/models", { method: "POST", body });
      form.reset();
      preset.value = made.preset;
      await onCreated(made);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      let target = fieldOf(err);
      if (target === "graph") target = "overrides";
      if (!target && err.code === "conflict" && err.detail.name !== undefined) target = "name";
      if (!target && ["invalid_override", "graph_too_large"].includes(err.code)) target = "overrides";
      if (!target && err.code === "invalid_preset") target = "preset";
      if (target === "overrides") {
        const where = lineOf(overrides.value, err.detail.key ?? err.detail.errors?.[0]?.loc?.split(".")[2]);
        err.message = `${where}${err.message}`;
      }
      showError(err, target, fields, banner);
    } finally {
      submit.disabled = false;
    }
  }

  const form = h("form", { "aria-labelledby": "create-preset-h", novalidate: true, onsubmit: onSubmit },
    h("h2", { id: "create-preset-h" }, "Create from preset"),
    h("div", { style: "display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 1.5rem" },
      h("div", {},
        labelled("Preset", preset, fields.preset.line),
        labelled("Name", name, fields.name.line),
        labelled("Overrides", overrides, hint, fields.overrides.line),
        h("p", {}, submit), banner),
      h("div", {}, h("h3", {}, "Default config"), defaults)));
  showDefaults();
  return form;
}

// -- upload a graph file --------------------------------------------------------------------

function uploadForm(onCreated) {
  const file = h("input", { type: "file", name: "file", accept: ".json,application/json" });
  const name = h("input", { name: "name", autocomplete: "off", placeholder: "the file's name" });
  const banner = h("div");
  const fields = { file: field("file", file), name: field("upload-name", name) };
  const submit = h("button", { type: "submit" }, "Upload");
  file.addEventListener("change", () => {
    const chosen = file.files?.[0];
    if (chosen && !name.value.trim()) name.value = chosen.name.replace(/\.json$/i, "");
  });

  async function onSubmit(event) {
    event.preventDefault();
    clearErrors(fields, banner);
    const chosen = file.files?.[0];
    if (!chosen) {
      showError(new Error("choose a graph JSON file (shardlab.graph/1)"), "file", fields, banner);
      return;
    }
    const modelName = name.value.trim() || chosen.name.replace(/\.json$/i, "");
    submit.disabled = true;
    try {
      const made = await api(`/api/models/upload?name=${encodeURIComponent(modelName)}`,
        { method: "POST", raw: new Blob([chosen], { type: "application/json" }) });
      form.reset();
      await onCreated(made);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      let target = fieldOf(err);
      if (target !== "name") target = err.code === "conflict" ? "name" : "file";
      showError(err, target, fields, banner);
    } finally {
      submit.disabled = false;
    }
  }

  const form = h("form", { "aria-labelledby": "upload-h", novalidate: true, onsubmit: onSubmit },
    h("h2", { id: "upload-h" }, "Upload graph file"),
    h("p", { class: "muted" }, "A graph JSON document (shardlab.graph/1), as ",
      h("code", {}, "shardlab export"), " writes it."),
    labelled("Graph file", file, fields.file.line),
    labelled("Name", name, fields.name.line),
    h("p", {}, submit), banner);
  return form;
}

// -- import a Hugging Face config -----------------------------------------------------------

/** The config text as a JSON object; throws saying what is wrong with it. */
export function parseConfig(text) {
  if (!text.trim()) throw new Error("choose a config.json file or paste the config JSON");
  let parsed;
  try { parsed = JSON.parse(text); } catch (err) { throw new Error(`invalid JSON: ${err.message}`); }
  if (typeof parsed !== "object" || Array.isArray(parsed) || parsed === null) {
    throw new Error("the config must be a JSON object (a Hugging Face config.json)");
  }
  return parsed;
}

/** An optional positive whole number field: undefined when empty; throws naming it. */
function optionalCount(input, what) {
  const text = input.value.trim();
  if (!text) return undefined;
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) throw new Error(`${what} must be a positive whole number, not '${text}'`);
  return n;
}

/** Import a Hugging Face config.json: queued as a job (the worker builds the model with
 * transformers on the meta device), its progress shown, then the new model or the job's
 * error (which names the config's field). */
function importForm(onCreated, signal) {
  const file = h("input", { type: "file", name: "hf-file", accept: ".json,application/json" });
  const hint = h("p", { class: "muted", id: "hf-config-hint" },
    "A config.json from the Hugging Face Hub (e.g. a Llama or GPT-2 config); the file's ",
    "content appears here, or paste it.");
  const config = h("textarea", { name: "hf-config", rows: 8, cols: 60, spellcheck: "false",
    "aria-describedby": hint.id });
  const name = h("input", { name: "hf-name", autocomplete: "off", placeholder: "the config's model name" });
  const batch = h("input", { name: "hf-batch", type: "number", min: 1, step: 1, placeholder: "1" });
  const seq = h("input", { name: "hf-seq", type: "number", min: 1, step: 1,
    placeholder: "from the config" });
  const banner = h("div");
  const progress = h("div", { class: "import-progress", "aria-live": "polite" });
  const fields = { config: field("hf-config", file, config), name: field("hf-name", name),
    batch: field("hf-batch", batch), seq: field("hf-seq", seq) };
  const submit = h("button", { type: "submit" }, "Import");
  file.addEventListener("change", async () => {
    const chosen = file.files?.[0];
    if (chosen) config.value = await chosen.text();
  });

  async function follow(created) {
    const bar = h("progress", { max: 1, value: 0, "aria-label": "import progress" });
    const note = h("span", { class: "muted" }, `import of ${created.name} queued`);
    progress.replaceChildren(bar, " ", note);
    const job = await followJob(created.job_id, (j) => {
      bar.value = j.progress; note.textContent = j.message;
    }, signal);
    if (job === null) return;  // the view was left
    if (job.status !== "succeeded") {
      progress.replaceChildren();
      const message = job.error?.message ?? `import ${job.status}: ${job.message}`;
      showError(new Error(`import failed: ${message}`), "config", fields, banner, [config]);
      return;
    }
    progress.replaceChildren();
    form.reset();
    await onCreated(await api(`/api/models/${job.result.model_id}`));
  }

  async function onSubmit(event) {
    event.preventDefault();
    clearErrors(fields, banner);
    const body = {};
    try {
      body.config = parseConfig(config.value);
    } catch (err) {
      showError(err, "config", fields, banner, [config]);
      return;
    }
    for (const [key, input, what] of [["batch", batch, "batch"], ["seq", seq, "seq"]]) {
      try {
        const n = optionalCount(input, what);
        if (n !== undefined) body[key] = n;
      } catch (err) {
        showError(err, key, fields, banner);
        return;
      }
    }
    if (name.value.trim()) body.name = name.value.trim();
    submit.disabled = true;
    try {
      await follow(await api("/api/models/import", { method: "POST", body }));
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      let target = fieldOf(err);
      if (!target && err.code === "conflict") target = "name";
      if (!["config", "name", "batch", "seq"].includes(target)) target = null;
      showError(err, target, fields, banner, target === "config" ? [config] : null);
    } finally {
      submit.disabled = false;
    }
  }

  const form = h("form", { "aria-labelledby": "hf-import-h", novalidate: true, onsubmit: onSubmit },
    h("h2", { id: "hf-import-h" }, "Import Hugging Face config"),
    h("p", { class: "muted" }, "The worker builds the model with transformers on the meta ",
      "device (no weights are downloaded) and stores its graph."),
    labelled("config.json file", file),
    labelled("Config JSON", config, hint, fields.config.line),
    labelled("Name", name, fields.name.line),
    labelled("Batch", batch, fields.batch.line),
    labelled("Sequence length", seq, fields.seq.line),
    h("p", {}, submit), progress, banner);
  return form;
}

export async function render(root, ctx) {
  const holder = h("div", {}, h("p", { class: "loading" }, "loading…"));
  const status = h("p", { role: "status", class: "muted" });
  const go = (offset) => ctx.setQuery({ offset: offset || null });
  const offset = Math.max(0, Number(ctx.query.get("offset")) || 0);
  const onCreated = async (made) => {
    await fillTable(holder, { offset, highlight: made.id, go });
    status.textContent = `Created model ${made.name}: ${fmtInt(made.params)} parameters.`;
    toast(`model ${made.name} created`);
  };
  const [presets] = await Promise.all([api("/api/presets"), fillTable(holder, { offset, go })]);
  root.append(
    h("h1", {}, "Models"),
    h("section", { class: "card", "aria-label": "team models" }, holder, status),
    h("section", { class: "card" }, presetForm(presets, onCreated)),
    h("section", { class: "card" }, uploadForm(onCreated)),
    h("section", { class: "card" }, importForm(onCreated, ctx.signal)));
}
