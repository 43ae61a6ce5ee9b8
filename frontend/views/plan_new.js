// A new plan: model, cluster, mesh axes, templates, annotations and passes -> a strategy
// (POST /api/strategies) and a plan (POST /api/plans) whose job is followed live.
import { api, ApiError, followJob } from "../api.js";
import { Field, clearErrors, errorLine, field, fieldOf, labelled, showError, uid } from "../forms.js";
import { errorBox, fmtInt, h } from "../ui.js";
import { modelSizePicker } from "./model_size.js";
import { accumulationPicker, pipelinePicker, recomputePicker } from "./training_options.js";

const INLINE = "display: inline; font-weight: normal; margin: 0 .4rem 0 .2rem";
const GRID = "display: grid; grid-template-columns: max-content max-content 1fr; gap: .35rem 1rem; "
  + "align-items: center";
const ROW = "display: flex; gap: .8rem; align-items: flex-end; margin: .2rem 0";

// -- which field an API error concerns ------------------------------------------------------

const BY_FIELD = { mesh: "mesh", templates: "templates", annotations: "annotations",
  options: "passes", cluster: "cluster", model_id: "model", name: "name" }; // fmt: skip

/** The form field an error of POST /api/strategies or /api/plans (or of the plan's job)
 * concerns, from the field it names, else from its code and detail; null: none. */
export function targetOf(err) {
  const d = err.detail ?? {};
  const msg = err.message ?? "";
  const named = fieldOf(err);
  if (named && named in BY_FIELD) return BY_FIELD[named];
  if (d.annotation !== undefined || /^annotation\b|by annotation\b/.test(msg)) return "annotations";
  if (d.template !== undefined || /^(unknown )?template\b/.test(msg)) return "templates";
  if (err.code === "invalid_pass" || d.passes !== undefined) return "passes";
  if (d.option === "recompute" || err.code === "invalid_recompute") return "recompute";
  if (err.code === "invalid_pipeline" || d.option === "pipeline") return "pipeline";
  if (d.option === "microbatches") return "microbatches";
  if (err.code === "invalid_cluster") return d.mesh !== undefined ? "mesh" : "cluster";
  if (err.code === "not_found") return { cluster: "cluster", model: "model" }[d.resource] ?? null;
  if (["invalid_mesh", "invalid_placement"].includes(err.code)) return "mesh";
  if (err.code === "conflict" && d.name !== undefined) return "name";
  return null;
}

const patternOf = (text) => text.slice(0, text.lastIndexOf("=")).trim();

/** The index of the annotations line an error is about (-1: none found): the line quoted in
 * the message or detail, or the line with the same glob as a (normalized) quoted one. */
export function annotationLine(lines, err) {
  const msg = err.message ?? "";
  const quoted = [err.detail?.annotation, ...[...msg.matchAll(/'([^']*=[^']*)'/g)].map((m) => m[1])]
    .filter(Boolean);
  const exact = lines.findIndex((l) => l.trim() && quoted.includes(l.trim()));
  if (exact >= 0) return exact;
  const globs = quoted.map(patternOf);
  return lines.findIndex((l) => l.includes("=") && globs.includes(patternOf(l.trim())));
}

// -- the mesh editor ------------------------------------------------------------------------

function meshEditor(initial, onChange) {
  const rows = h("div", {});
  const line = errorLine("mesh");
  const list = [];
  let ready = false; // onChange only once the initial rows are in
  const f = new Field(() => list.flatMap((r) => [r.name, r.size]), line);

  function renumber() {
    list.forEach((r, i) => {
      r.nameLabel.textContent = `Axis ${i + 1} name`;
      r.sizeLabel.textContent = `Axis ${i + 1} size`;
      r.remove.textContent = "Remove";
      r.remove.setAttribute("aria-label", `Remove mesh axis ${i + 1}${r.name.value ? ` (${r.name.value})` : ""}`);
      r.remove.disabled = list.length === 1;
    });
    if (ready) onChange();
  }

  function add(axis = "", size = 2) {
    const name = h("input", { value: axis, size: 8, autocomplete: "off", spellcheck: "false",
      "data-mesh": "name", oninput: renumber });
    const sizeInput = h("input", { type: "number", min: 1, step: 1, value: size,
      style: "width: 6rem", "data-mesh": "size", oninput: renumber });
    const [nameLabel] = labelled("", name);
    const [sizeLabel] = labelled("", sizeInput);
    const row = { name, size: sizeInput, nameLabel, sizeLabel };
    row.remove = h("button", { type: "button", class: "secondary", onclick: () => {
      list.splice(list.indexOf(row), 1);
      el.remove();
      renumber();
    } });
    const el = h("div", { style: ROW },
      h("div", {}, nameLabel, name), h("div", {}, sizeLabel, sizeInput), row.remove);
    list.push(row);
    rows.append(el);
    renumber();
    return row;
  }

  for (const [axis, size] of initial) add(axis, size);
  ready = true;
  const addButton = h("button", { type: "button", class: "secondary", onclick: () => {
    const used = new Set(list.map((r) => r.name.value.trim()));
    add(["dp", "tp", "pp", "sp", "ep"].find((a) => !used.has(a)) ?? "", 2).name.focus();
  } }, "Add axis");
  return {
    field: f, list,
    element: [rows, h("p", {}, addButton)],
    axes: () => list.map((r) => r.name.value.trim()).filter(Boolean),
    text: () => list.map((r) => `${r.name.value.trim()}=${r.size.value.trim()}`).join(","),
    devices: () => list.reduce((n, r) => n * (Number.parseInt(r.size.value, 10) || 0), 1),
  };
}

function parseMesh(text) {
  return (text ?? "").split(",").map((t) => t.split("=")).filter(([a, s]) => a && s)
    .map(([a, s]) => [a.trim(), Number.parseInt(s, 10) || 1]);
}

// -- templates and passes -------------------------------------------------------------------

function templatePicker(templates, chosen) {
  const items = templates.map((t) => {
    const given = chosen.find((c) => c.split(":")[0] === t.name);
    const box = h("input", { type: "checkbox", value: t.name, checked: given !== undefined });
    const axis = h("select", { "aria-label": `mesh axis of template ${t.name}` });
    return { t, box, axis, wanted: given?.split(":")[1] ?? "" };
  });
  const line = errorLine("templates");
  const warning = h("p", { class: "warning", role: "status", id: "templates-warning", hidden: true });
  const f = new Field(() => items.flatMap((i) => [i.box, i.axis]), line);
  let meshAxes = [];
  // a checked template left on its default axis, which the mesh lacks (with one mesh axis
  // the template takes it): said before the API refuses it
  const warn = () => {
    const lost = items.filter((i) => i.box.checked && !i.axis.value && meshAxes.length > 1
      && !meshAxes.includes(i.t.default_axis));
    warning.hidden = !lost.length;
    warning.textContent = lost.map((i) => `${i.t.name} works on mesh axis `
      + `${i.t.default_axis}, which this mesh lacks (axes ${meshAxes.join(", ")}): choose its `
      + "axis or add one of that name.").join(" ");
  };
  for (const i of items) {
    i.box.addEventListener("change", warn);
    i.axis.addEventListener("change", warn);
  }
  const element = h("fieldset", {},
    h("legend", {}, "Templates"),
    h("p", { class: "muted" }, "Applied in this order on the chosen mesh axis (default: the ",
      "template's own axis, or the only one)."),
    h("div", { style: GRID }, items.flatMap(({ t, box, axis }) => {
      const [label] = labelled(t.name, box);
      label.setAttribute("style", INLINE);
      return [h("span", {}, box, label), axis, h("span", { class: "muted" }, t.description)];
    })),
    warning, line);
  return {
    field: f, items, element,
    setAxes(axes) {
      for (const { t, axis } of items) {
        const keep = axis.value || items.find((i) => i.axis === axis).wanted;
        axis.replaceChildren(h("option", { value: "" }, `default (${t.default_axis})`),
          ...axes.map((a) => h("option", { value: a }, a)));
        axis.value = axes.includes(keep) ? keep : "";
      }
      meshAxes = axes;
      warn();
    },
    value: () => items.filter((i) => i.box.checked)
      .map((i) => (i.axis.value ? `${i.t.name}:${i.axis.value}` : i.t.name)),
  };
}

function passPicker(passes) {
  const items = passes.map((p) => {
    const box = h("input", { type: "checkbox", value: p.name, checked: p.default_on });
    const options = Object.entries(p.options).map(([key, value]) => ({
      key, value,
      input: h("input", { type: typeof value === "number" ? "number" : "text", value: String(value),
        style: "width: 6rem", "aria-label": `${p.name} ${key}` }),
    }));
    return { p, box, options };
  });
  const line = errorLine("passes");
  const f = new Field(() => items.flatMap((i) => [i.box, ...i.options.map((o) => o.input)]), line);
  const element = h("fieldset", {},
    h("legend", {}, "Optimization passes"),
    h("div", { style: GRID }, items.flatMap(({ p, box, options }) => {
      const [label] = labelled(p.name, box);
      label.setAttribute("style", INLINE);
      return [h("span", {}, box, label),
        h("span", {}, options.map((o) => h("span", {}, h("span", { class: "muted" }, `${o.key} `), o.input))),
        h("span", { class: "muted" }, p.description)];
    })),
    line);
  /** `options.passes`: only what differs from the defaults (null when nothing does). */
  function value() {
    const out = {};
    for (const { p, box, options } of items) {
      const changed = options.filter((o) => String(o.value) !== o.input.value.trim());
      if (!box.checked) {
        if (p.default_on) out[p.name] = false;
      } else if (changed.length) {
        out[p.name] = Object.fromEntries(options.map((o) => [o.key,
          typeof o.value === "number" ? Number(o.input.value) : o.input.value.trim()]));
      } else if (!p.default_on) {
        out[p.name] = true;
      }
    }
    return Object.keys(out).length ? out : null;
  }
  return { field: f, element, value };
}

// -- the strategy's automatic name ----------------------------------------------------------

/** A readable name for an unnamed strategy: "dp=8,tp=8 dp+megatron_tp", with what else it
 * sets ("recompute full", "pipeline 1f1b"). */
export function autoName(def) {
  const o = def.options ?? {};
  return [def.mesh, def.templates.join("+"), o.recompute ? `recompute ${o.recompute}` : "",
    o.pipeline ? `pipeline ${o.pipeline.schedule}${o.pipeline.microbatches
      ? ` ×${o.pipeline.microbatches}` : ""}` : "",
    o.microbatches ? `accumulate ×${o.microbatches}` : "",
    def.annotations.length ? `+${def.annotations.length} annotations` : ""]
    .filter(Boolean).join(" ").slice(0, 180);
}

/** Create the strategy under its automatic name; when the team has one of that name, the
 * next free "(2)", "(3)", ... */
async function autoNamed(def) {
  const base = autoName(def);
  for (let n = 1; ; n += 1) {
    try {
      return await api("/api/strategies", { method: "POST",
        body: { name: n === 1 ? base : `${base} (${n})`, ...def } });
    } catch (err) {
      if (!(err instanceof ApiError && err.code === "conflict" && n < 50)) throw err;
    }
  }
}

// -- the view -------------------------------------------------------------------------------

function clusterText(c) {
  return `${fmtInt(c.devices)} devices (${c.nodes} node${c.nodes === 1 ? "" : "s"} × ${c.devices_per_node})`;
}

export async function render(root, ctx) {
  const [models, clusters, templates, passes] = await Promise.all([
    api("/api/models?limit=1000"), api("/api/clusters"), api("/api/templates"), api("/api/passes")]);
  root.append(h("h1", {}, "New plan"));
  if (!models.length) {
    root.append(h("p", {}, "No models yet: ", h("a", { href: "#/models" }, "create one"), " first."));
    return;
  }
  const q = ctx.query;
  const model = h("select", {}, models.map((m) =>
    h("option", { value: m.id }, `${m.name} — ${fmtInt(m.params)} parameters`)));
  if (q.get("model")) model.value = q.get("model");
  // a combobox: the listed clusters, or any other preset name (`h100-sxm-1x4`) or team cluster
  const listId = uid("clusters");
  const cluster = h("input", { list: listId, autocomplete: "off", spellcheck: "false", size: 24,
    value: q.has("cluster") ? q.get("cluster") : clusters[0]?.name ?? "",
    placeholder: "e.g. h100-sxm-1x8; empty: not costed" });
  const clusterList = h("datalist", { id: listId }, clusters.map((c) =>
    h("option", { value: c.name }, `${c.devices} devices${c.description ? ` — ${c.description}` : ""}`)));
  const known = new Map(clusters.map((c) => [c.name, c]));
  let chosen = known.get(cluster.value.trim()) ?? null;
  const devices = h("span", { class: "muted", id: uid("cluster-devices") });
  const meshStatus = h("p", { "aria-live": "polite", id: uid("mesh-devices") });
  const selected = () => chosen;
  const mesh = meshEditor(parseMesh(q.get("mesh")).length ? parseMesh(q.get("mesh"))
    : [["dp", selected()?.devices ?? 1]], () => update());
  const tpl = templatePicker(templates, (q.get("templates") ?? "").split(",").filter(Boolean));
  const pass = passPicker(passes);
  const recompute = recomputePicker(q.get("recompute"));
  const pipeline = pipelinePicker(q);
  const accumulation = accumulationPicker(q);
  const batchSeq = modelSizePicker(q, models);
  model.addEventListener("change", () => batchSeq.showModel(model.value));
  batchSeq.showModel(model.value);
  const hint = h("p", { class: "muted", id: uid("annotations-hint") },
    "One per line: ", h("code", {}, "glob=S(0)R"), " (one placement per mesh axis) or ",
    h("code", {}, "glob=dp:S(0),tp:R"), " (named axes), e.g. ", h("code", {}, "w0=S(1)"),
    ". Applied after the templates; the later wins.");
  const annotations = h("textarea", { rows: 4, cols: 50, spellcheck: "false",
    "aria-describedby": hint.id, placeholder: "layers.*.mlp.up_proj.weight=tp:S(1)" });
  annotations.value = q.get("annotations") ?? "";
  const name = h("input", { size: 40, autocomplete: "off", placeholder: "automatic" });
  const fields = {
    model: field("model", model), cluster: field("cluster", cluster), mesh: mesh.field,
    templates: tpl.field, annotations: field("annotations", annotations), passes: pass.field,
    recompute: recompute.field, pipeline: pipeline.field, microbatches: accumulation.field,
    name: field("strategy-name", name),
    size: batchSeq.field,
  };
  const banner = h("div");
  const submit = h("button", { type: "submit" }, "Create plan");

  function update() {
    const c = selected();
    devices.textContent = c ? clusterText(c) : cluster.value.trim() ? ""
      : "no cost model: step time, MFU and memory are not predicted";
    const n = mesh.devices();
    const shape = mesh.list.map((r) => r.size.value || "?").join(" × ");
    let verdict = "";
    if (c) {
      verdict = n === c.devices ? `matches the ${c.devices} devices of ${c.name}`
        : n < c.devices ? `uses ${n} of the ${c.devices} devices of ${c.name}`
          : `more than the ${c.devices} devices of ${c.name}`;
    }
    meshStatus.textContent = `mesh ${mesh.text()}: ${shape} = ${fmtInt(n)} devices${verdict ? `, ${verdict}` : ""}`;
    meshStatus.className = c && n > c.devices ? "field-error" : c && n < c.devices ? "warning" : "muted";
    tpl.setAxes(mesh.axes());
    pipeline.setAxes(mesh.axes());
    accumulation.setAxes(mesh.axes());
  }
  // the device count of a cluster typed in: GET /api/clusters/{name}, once typing pauses
  let lookups = 0;
  let timer = null;
  async function lookup() {
    const name = cluster.value.trim();
    const token = ++lookups;
    fields.cluster.clear();
    chosen = known.get(name) ?? null;
    if (!name || chosen) {
      update();
      return;
    }
    devices.textContent = "…";
    try {
      const found = await api(`/api/clusters/${encodeURIComponent(name)}`);
      known.set(name, found);
      if (token === lookups) chosen = found;
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      if (token === lookups) fields.cluster.show(err.message);
    }
    if (token === lookups) update();
  }
  cluster.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(lookup, 300);
  });
  cluster.addEventListener("change", () => {
    clearTimeout(timer);
    lookup();
  });
  lookup();

  // the strategy of the last submit, reused (or versioned) when the form is sent again
  let last = null;
  async function strategyId(def) {
    const key = JSON.stringify(def);
    const given = name.value.trim();
    if (last && last.key === key && (!given || given === last.name)) return last.id;
    let made;
    if (last && given && given === last.name) {
      made = await api(`/api/strategies/${last.id}`, { method: "PUT", body: def });
    } else if (given) {
      made = await api("/api/strategies", { method: "POST", body: { name: given, ...def } });
    } else {
      made = await autoNamed(def);
    }
    last = { key, id: made.id, name: made.name };
    return made.id;
  }

  function fail(err) {
    const target = targetOf(err);
    let only = null;
    if (target === "annotations") {
      const lines = annotations.value.split("\n");
      const i = annotationLine(lines, err);
      if (i >= 0) err.message = `line ${i + 1} (${lines[i].trim()}): ${err.message}`;
    } else if (target === "templates" && err.detail?.template) {
      const item = tpl.items.find((it) => it.t.name === err.detail.template);
      if (item) only = [item.box, item.axis];
    } else if (target === "mesh" && (err.detail?.axis || err.detail?.token)) {
      const rows = mesh.list.filter((r) => r.name.value.trim() === err.detail.axis
        || `${r.name.value.trim()}=${r.size.value.trim()}` === err.detail.token);
      if (rows.length) only = rows.flatMap((r) => [r.name, r.size]);
    }
    showError(err, target, fields, banner, only);
  }

  // -- the job ------------------------------------------------------------------------------
  const progress = h("progress", { max: 1, value: 0, "aria-label": "plan job progress" });
  const jobMessage = h("span", { id: "plan-job-message", role: "status" });
  const cancel = h("button", { type: "button", class: "secondary" }, "Cancel");
  const jobTitle = h("h2", {});
  const jobResult = h("div");
  const jobBox = h("section", { class: "card", hidden: true, "aria-labelledby": uid("job") },
    jobTitle, h("p", {}, progress, " ", jobMessage, " ", cancel), jobResult);
  jobTitle.id = jobBox.getAttribute("aria-labelledby");

  async function follow(created) {
    jobBox.hidden = false;
    jobResult.replaceChildren();
    jobTitle.textContent = `Plan #${created.id} (job ${created.job_id})`;
    const show = (job) => {
      progress.value = job.progress ?? 0;
      jobMessage.textContent = job.status === "running" || job.status === "queued"
        ? `${job.status}: ${job.message || "…"}` : job.status;
    };
    show({ status: created.status, progress: 0, message: "waiting for a worker" });
    cancel.hidden = false;
    cancel.disabled = false;
    cancel.onclick = async () => {
      cancel.disabled = true;
      try {
        const job = await api(`/api/jobs/${created.job_id}/cancel`, { method: "POST" });
        jobMessage.textContent = job.status === "cancelled" ? "cancelled" : "cancelling…";
      } catch (err) {
        jobResult.replaceChildren(errorBox(err));
      }
    };
    const job = await followJob(created.job_id, show, ctx.signal);
    if (!job) return; // the user left the page
    show(job);
    cancel.hidden = true;
    const link = h("a", { href: `#/plans/${created.id}` }, `plan #${created.id}`);
    if (job.status === "succeeded") {
      jobResult.replaceChildren(h("p", {}, "Built: ", link));
      location.hash = `#/plans/${created.id}`;
      return;
    }
    jobResult.replaceChildren(h("p", { class: `status-${job.status}` }, `The job ended ${job.status}: `, link));
    if (job.status === "failed" && job.error) fail(new ApiError(422, job.error));
  }

  async function onSubmit(event) {
    event.preventDefault();
    clearErrors(fields, banner);
    const lines = annotations.value.split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
    const passConfig = pass.value();
    const options = passConfig ? { passes: passConfig } : {};
    if (recompute.value() !== "none") options.recompute = recompute.value();
    if (pipeline.value()) options.pipeline = pipeline.value();
    if (accumulation.value()) options.microbatches = accumulation.value();
    const def = { mesh: mesh.text(), templates: tpl.value(), annotations: lines, options };
    submit.disabled = true;
    try {
      let modelId;
      try {
        modelId = await batchSeq.resolve(Number(model.value));
      } catch (err) {
        if (!(err instanceof ApiError)) throw err;
        showError(err, "size", fields, banner);
        return;
      }
      const strategy = await strategyId(def);
      const created = await api("/api/plans", { method: "POST", body: {
        model_id: modelId, strategy_id: strategy, cluster: cluster.value.trim() || null } });
      const extra = batchSeq.value();
      ctx.setQuery({ model: model.value, cluster: cluster.value.trim(), mesh: def.mesh,
        recompute: recompute.value() === "none" ? "" : recompute.value(),
        batch: extra.batch, seq: extra.seq });
      await follow(created);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      fail(err);
    } finally {
      submit.disabled = false;
    }
  }

  root.append(h("form", { class: "card", novalidate: true, onsubmit: onSubmit, "aria-label": "new plan" },
    labelled("Model", model, fields.model.line),
    batchSeq.element,
    labelled("Cluster", cluster, clusterList, " ", devices, fields.cluster.line),
    h("fieldset", {}, h("legend", {}, "Mesh axes"), mesh.element, meshStatus, mesh.field.line),
    tpl.element,
    labelled("Annotations", annotations, hint, fields.annotations.line),
    pass.element,
    h("p", {}, ...recompute.element),
    pipeline.element,
    accumulation.element,
    labelled("Strategy name", name, fields.name.line),
    h("p", {}, submit), banner),
    jobBox);
}
