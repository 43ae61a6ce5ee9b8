// One plan's overview: job state (live), headline cost, collectives and why each exists,
// fallback ops, ops per role, verification against one device (simulated, or "Run for real"
// on torch ranks when a live worker has them), the Chrome trace, exports for PyTorch.
import { api, followJob } from "../api.js";
import { errorBox, fmtBytes, fmtInt, fmtPercent, fmtTime, h, planTabs, toast } from "../ui.js";
import { exportSection } from "./plan_export.js";
import { pipelineSection } from "./plan_pipeline.js";

function figure(label, value, note = "") {
  return h("div", { class: "figure" }, h("div", { class: "muted" }, label),
    h("div", { class: "value" }, value), note ? h("div", { class: "muted" }, note) : null);
}

function headline(summary) {
  const cost = summary.cost;
  const figures = [
    figure("Program ops per rank", fmtInt(summary.program_ops)),
    figure("Comm per rank", fmtBytes(summary.comm_bytes_per_rank)),
  ];
  if (cost) {
    figures.unshift(
      figure("Step time", fmtTime(cost.step_time_s), `on ${cost.cluster}`),
      figure("MFU", fmtPercent(cost.mfu), `HFU ${fmtPercent(cost.hfu)} (recomputation included)`),
      figure("Tokens / s", fmtInt(Math.round(cost.tokens_per_s))),
      figure("Peak memory / rank", fmtBytes(cost.peak_memory_bytes),
        `${cost.fits ? "fits" : "does NOT fit"} in ${fmtBytes(cost.memory_capacity_bytes)}`),
      figure("Exposed comm", fmtTime(cost.exposed_comm_s),
        `${fmtPercent(cost.overlap_fraction)} of comm hidden`));
  }
  return h("section", { class: "figures", "aria-label": "headline figures" }, figures);
}

function collectivesByKind(summary) {
  const rows = Object.entries(summary.collectives ?? {});
  return h("table", { "aria-label": "collectives by kind" },
    h("thead", {}, h("tr", {}, h("th", {}, "Kind"), h("th", { class: "num" }, "Count"),
      h("th", { class: "num" }, "Bytes / rank"), h("th", {}, "Reasons"))),
    h("tbody", {}, rows.map(([kind, c]) => h("tr", {},
      h("td", {}, kind), h("td", { class: "num" }, c.count),
      h("td", { class: "num" }, fmtBytes(c.bytes_per_rank)),
      h("td", {}, h("ul", {}, c.reasons.map((r) => h("li", {}, `${r.count} × ${r.reason}`))))))));
}

/** Does collective `c` match the filter text `q` (its op name, value, kind or reason)? */
function matchesFilter(c, q) {
  if (!q) return true;
  const hay = [c.name, c.value, c.kind, c.reason, (c.axes ?? []).join(",")].join("\n").toLowerCase();
  return q.toLowerCase().split(/\s+/).filter(Boolean).every((word) => hay.includes(word));
}

/** The program's collectives, with a text filter; choosing one shows its full explanation. */
async function collectiveList(planId, ctx) {
  const all = await api(`/api/plans/${planId}/collectives`);
  const detail = h("div", { class: "panel collective-detail", id: "collective-detail",
    "aria-live": "polite" },
  h("p", { class: "muted" }, "Choose a collective to see why it was inserted."));
  async function explain(name) {
    ctx.setQuery({ collective: name });
    const c = await api(`/api/plans/${planId}/collectives/${encodeURIComponent(name)}`);
    const text = (k) => (Array.isArray(c[k]) ? c[k].join(", ") : String(c[k] ?? "")) || "–";
    detail.replaceChildren(h("h3", { title: c.name }, c.name),
      h("dl", {},
        ["kind", "axes", "value", "from", "to", "consumer", "scope"].flatMap((k) =>
          [h("dt", {}, k), h("dd", { title: text(k) }, text(k))]),
        h("dt", {}, "bytes / rank"), h("dd", {}, fmtBytes(c.bytes_per_rank)),
        h("dt", {}, "predicted time"), h("dd", {}, c.time_s ? fmtTime(c.time_s) : "–")),
      h("p", {}, h("strong", {}, "Why: "), c.reason));
  }
  const items = all.map((c) => h("li", {}, h("button", {
    class: "secondary", type: "button", onclick: () => explain(c.name).catch(showError),
  }, `${c.kind} on ${c.axes.join(",")}`), " ", h("code", {}, c.value ?? c.name),
  h("span", { class: "muted" }, ` — ${fmtBytes(c.bytes_per_rank)}`)));
  const list = h("ul", { class: "collectives", "aria-label": "inserted collectives" }, items);
  const count = h("span", { class: "muted", id: "collective-count", "aria-live": "polite" },
    `${all.length} of ${all.length}`);
  const filter = h("input", { type: "search", id: "collective-filter",
    placeholder: "op name, kind or reason", "aria-label": "filter collectives" });
  filter.addEventListener("input", () => {
    let shown = 0;
    all.forEach((c, i) => {
      const hit = matchesFilter(c, filter.value.trim());
      items[i].hidden = !hit;
      shown += hit ? 1 : 0;
    });
    count.textContent = `${shown} of ${all.length}`;
  });
  const wanted = ctx.query.get("collective");
  if (wanted) explain(wanted).catch(showError);
  function showError(err) { detail.replaceChildren(errorBox(err)); }
  return h("section", { class: "split collectives-split" },
    h("div", {}, h("div", { class: "collective-filter" },
      h("label", { for: "collective-filter" }, "Filter"), filter, " ", count), list), detail);
}

/** Ranks of a mesh written "dp=2,tp=4" (8). */
export function meshSize(mesh) {
  return String(mesh ?? "").split(",").reduce((n, part) => n * (Number(part.split("=")[1]) || 1), 1);
}

/** Where a torch-backend run of `ranks` ranks could go: "cuda" when a live worker has that
 * many CUDA devices, else "cpu" when one has torch and room for them, else null
 * (`backend/devices.py`'s rule). */
export function realDevice(workers, ranks) {
  const torch = workers.filter((w) => w.devices.torch);
  if (torch.some((w) => w.devices.cuda.length >= ranks)) return "cuda";
  if (torch.some((w) => w.devices.max_cpu_ranks >= ranks)) return "cpu";
  return null;
}

/** Verification: on the simulated mesh, and ("Run for real") on real torch ranks when a
 * live worker can serve them (GET /api/workers). */
function verifySection(planId, summary, workers) {
  const out = h("div", { "aria-live": "polite" });
  const ranks = meshSize(summary.mesh);
  const device = realDevice(workers, ranks);
  const buttons = [h("button", { type: "button" }, "Verify against one device")];
  if (device) buttons.push(h("button", { type: "button", class: "secondary",
    title: `one training step on ${ranks} torch ranks (${device}) on a worker that has them` },
  "Run for real"));
  async function run(body, where) {
    buttons.forEach((b) => { b.disabled = true; });
    try {
      const created = await api("/api/verifications",
        { method: "POST", body: { plan_id: planId, ...body } });
      const bar = h("progress", { max: 1, value: 0, "aria-label": "verification progress" });
      const note = h("span", { class: "muted" }, "");
      out.replaceChildren(bar, " ", note);
      await followJob(created.job_id, (job) => {
        bar.value = job.progress; note.textContent = job.message;
      });
      const v = await api(`/api/verifications/${created.id}`);
      const r = v.report;
      out.replaceChildren(r
        ? h("p", { class: r.ok ? "status-succeeded" : "status-failed" },
          r.ok ? `numerics match${where}: ${r.checks.length} tensors checked (${r.compute_dtype})`
            : `MISMATCH${where}: ${r.failed} tensors differ; first divergence at ${r.first_divergence}`)
        : errorBox(new Error(v.error?.message ?? `verification ${v.status}`)));
      if (r?.summary?.twin) out.append(twinNote(r.summary.twin));
    } catch (err) {
      out.replaceChildren(errorBox(err));
    } finally {
      buttons.forEach((b) => { b.disabled = false; });
    }
  }
  buttons[0].addEventListener("click", () => run({}, ""));
  if (device) {
    buttons[1].addEventListener("click", () => run({ backend: "torch", nproc: ranks, device },
      ` on ${ranks} torch ranks (${device})`));
  }
  return h("section", {}, h("h2", {}, "Verification"), ...buttons, out);
}

/** What a verification of a model too large to run here ran instead: its scaled-down twin. */
function twinNote(twin) {
  const gib = (n) => `${(n / 2 ** 30).toFixed(1)} GiB`;
  const changes = Object.entries(twin.changes).map(([k, [a, b]]) => `${k} ${a}→${b}`).join(", ");
  return h("p", { class: "muted twin-note" },
    `Verified a scaled-down twin, not the model itself: the model would hold about `
    + `${gib(twin.full_estimate_bytes)} (limit ${gib(twin.limit_bytes)}). Same mesh, templates `
    + `and placements, with ${changes}.`);
}

/** The plan against the baseline of its model and cluster (figures and change), and the
 * baselines this plan is; null when there is neither. */
function baselineSection(plan) {
  const is = plan.baseline_of ?? [];
  const b = plan.baseline;
  if (!is.length && !b) return null;
  const fmt = (f, v) => (f.figure === "step_time_s" ? fmtTime(v)
    : f.figure === "mfu" ? fmtPercent(v)
      : f.figure === "peak_memory_bytes" ? fmtBytes(v) : fmtInt(Math.round(v)));
  return h("section", { "aria-label": "baseline" },
    h("h2", {}, "Baseline"),
    is.length ? h("p", { id: "baseline-of" }, `This plan is the baseline ${is.map((n) => `"${n}"`)
      .join(", ")}.`) : null,
    b ? h("p", {}, "Compared with baseline ", h("strong", {}, `"${b.name}"`), ": ",
      h("a", { href: `#/plans/${b.plan_id}` }, `plan #${b.plan_id}`), " · ",
      h("a", { href: `#/compare?a=${b.plan_id}&b=${plan.id}` }, "full comparison")) : null,
    b?.figures ? h("table", { "aria-label": "against the baseline" },
      h("thead", {}, h("tr", {}, ["Figure", "Baseline", "This plan", "Change"].map((t, i) =>
        h("th", { class: i ? "num" : null }, t)))),
      h("tbody", {}, b.figures.map((f) => h("tr", {},
        h("td", {}, f.label), h("td", { class: "num" }, fmt(f, f.baseline)),
        h("td", { class: "num" }, fmt(f, f.plan)),
        h("td", { class: `num ${f.regression ? "status-failed" : ""}` },
          `${f.change_pct >= 0 ? "+" : ""}${f.change_pct.toFixed(1)}%`,
          f.regression ? " (worse)" : ""))))) : null);
}

/** A queued or running plan: live progress and a cancel button; re-renders when it ends. */
async function pending(root, plan, ctx) {
  const bar = h("progress", { max: 1, value: plan.progress, "aria-label": "plan job progress" });
  const message = h("span", { class: "muted" }, plan.message);
  const cancel = h("button", { type: "button", class: "secondary" }, "Cancel");
  cancel.addEventListener("click", async () => {
    try { await api(`/api/jobs/${plan.job_id}/cancel`, { method: "POST" }); toast("cancelling"); }
    catch (err) { root.append(errorBox(err)); }
  });
  root.append(h("p", {}, bar, " ", message, " ", cancel));
  const job = await followJob(plan.job_id, (j) => {
    bar.value = j.progress; message.textContent = `${j.status}: ${j.message}`;
  }, ctx.signal);
  if (job && !ctx.signal.aborted) window.dispatchEvent(new HashChangeEvent("hashchange"));
}

export async function render(root, ctx) {
  const planId = Number(ctx.params.id);
  const plan = await api(`/api/plans/${planId}`);
  root.append(planTabs(planId, "overview"),
    h("h1", {}, `Plan ${planId} · overview`,
      plan.summary ? h("span", { class: "muted heading-suffix" }, ` · ${plan.summary.model}`) : ""),
    h("p", {}, h("span", { class: `status-${plan.status}` }, plan.status), " · ",
      plan.summary?.strategy ?? "", plan.cluster ? ` · cluster ${plan.cluster}` : ""));
  if (["queued", "running"].includes(plan.status)) return pending(root, plan, ctx);
  if (plan.status !== "succeeded") {
    root.append(errorBox(new Error(plan.error?.message ?? plan.message)));
    return;
  }
  const s = plan.summary;
  root.append(headline(s));
  const baseline = baselineSection(plan);
  if (baseline) root.append(baseline);
  if (s.pipeline) root.append(pipelineSection(s.pipeline));
  if (s.notes?.length) root.append(h("ul", { "aria-label": "notes" }, s.notes.map((n) => h("li", {}, n))));
  if (s.cost) {
    root.append(h("p", {}, h("a", { href: `/api/plans/${planId}/trace`, download: "" },
      "Download Chrome trace"), h("span", { class: "muted" }, " — open it in Perfetto")));
  }
  root.append(exportSection(planId));
  root.append(h("h2", {}, "Collectives"), collectivesByKind(s), await collectiveList(planId, ctx));
  root.append(h("h2", {}, "Ops per role"), h("p", {},
    Object.entries(s.ops_by_role).map(([role, n]) => `${role}: ${n}`).join(" · ")));
  root.append(h("h2", {}, "Fallback ops"), s.fallback_ops.length
    ? h("ul", { "aria-label": "fallback ops" }, s.fallback_ops.map((op) =>
      h("li", {}, typeof op === "string" ? op : JSON.stringify(op))))
    : h("p", { class: "muted" }, "None: every op has an SPMD rule."));
  const workers = await api("/api/workers").catch(() => []);
  root.append(verifySection(planId, s, workers));
}
