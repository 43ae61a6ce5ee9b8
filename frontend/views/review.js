// The review panel shown under every plan view (the shell adds it): the review state badge,
// reviewers and their decisions, threads with their anchors as permalinks, a comment box
// anchored to what the view has selected, approve / request changes, make the plan a
// baseline, and the history.
//
// Every plan view keeps its selection in the URL (`op`, `value`, `collective`, `scope` in the
// graph; `value` in the sharding view; `t0`/`t1` in the timeline; `b` in the passes view), so
// the panel reads the anchor a new thread may take from the address bar when asked.
import { api } from "../api.js";
import { errorBox, fmtTime, h, toast } from "../ui.js";

const STATE_TEXT = {
  none: "no review",
  pending: "review pending",
  changes_requested: "changes requested",
  approved: "approved",
};

/** The review state as a badge (also used by the plans list). */
export function reviewBadge(state) {
  return h("span", { class: `review-badge review-${state}`, "data-review-state": state },
    STATE_TEXT[state] ?? state);
}

/** What the current view has selected, as an anchor (null: nothing anchorable). */
export function anchorFromLocation() {
  const [path, search = ""] = location.hash.replace(/^#/, "").split("?");
  const q = new URLSearchParams(search);
  const view = path.split("/")[3] ?? "overview";
  const named = (kind, key = kind) => (q.get(key) ? { kind, name: q.get(key) } : null);
  if (view === "graph") {
    return named("collective") ?? named("op") ?? named("value") ?? named("scope");
  }
  if (view === "overview") return named("collective");
  if (view === "sharding") return named("value");
  if (view === "passes") return named("pass", "b");
  if (view === "timeline" && q.get("t0") && q.get("t1")) {
    return { kind: "timeline", start_s: Number(q.get("t0")), end_s: Number(q.get("t1")) };
  }
  return null;
}

function anchorLabel(anchor) {
  if (!anchor) return "the whole plan";
  if (anchor.kind === "timeline") {
    return `timeline ${fmtTime(anchor.start_s)} – ${fmtTime(anchor.end_s)}`;
  }
  return `${anchor.kind} ${anchor.name}`;
}

/** The panel for plan `planId`; `me` is /api/me. Returns the <section> at once and fills
 * it from the API (errors show inside it). */
export function reviewPanel(planId, me, signal) {
  const section = h("section", { class: "card review", "aria-label": "review",
    id: "review-panel" }, h("p", { class: "loading" }, "loading the review…"));
  const base = `/api/plans/${planId}`;

  async function act(request) {
    try {
      await request();
      await refresh();
    } catch (err) {
      section.querySelector(".review-error")?.replaceChildren(errorBox(err));
    }
  }

  function threadView(thread, review) {
    const mayDelete = me.is_admin || (me.user && me.user === review.author);
    const reply = h("textarea", { rows: 2, "aria-label": `reply to thread ${thread.id}` });
    return h("li", { class: `review-thread${thread.resolved ? " resolved" : ""}`,
      dataset: { threadId: thread.id } },
    h("div", { class: "review-anchor" },
      h("a", { href: thread.permalink, class: "review-permalink" }, thread.anchor_text),
      thread.resolved ? h("span", { class: "muted" }, ` · resolved by ${thread.resolved_by}`)
        : null),
    h("ol", { class: "review-comments" }, thread.comments.map((c) => h("li", {},
      h("strong", {}, c.author ?? "?"), " ", h("span", { class: "review-body" }, c.body)))),
    thread.resolved ? null : h("div", { class: "review-reply" }, reply,
      h("button", { type: "button", class: "secondary", onclick: () => act(() => api(
        `${base}/comments`, { method: "POST", body: { body: reply.value, thread_id: thread.id } })) },
      "Reply")),
    h("div", { class: "review-actions" },
      h("button", { type: "button", class: "secondary", onclick: () => act(() => api(
        `${base}/comments/${thread.id}/resolve`,
        { method: "POST", body: { resolved: !thread.resolved } })) },
      thread.resolved ? "Reopen thread" : "Resolve thread"),
      mayDelete ? h("button", { type: "button", class: "secondary danger", onclick: () =>
        act(() => api(`${base}/comments/${thread.id}`, { method: "DELETE" })) },
      "Delete thread") : null));
  }

  function newThreadForm() {
    const body = h("textarea", { rows: 3, id: "review-new-comment", "aria-label": "new comment" });
    const choice = h("select", { "aria-label": "comment on" });
    const fill = () => {
      const here = anchorFromLocation();
      const options = [h("option", { value: "plan" }, "on the whole plan")];
      if (here) options.unshift(h("option", { value: "here" }, `on ${anchorLabel(here)} (selected)`));
      choice.replaceChildren(...options);
      choice.anchor = here;
    };
    fill();
    body.addEventListener("focus", fill);
    const submit = () => act(async () => {
      const anchor = choice.value === "here" ? choice.anchor : null;
      await api(`${base}/comments`, { method: "POST", body: { body: body.value, anchor } });
      toast(`comment added on ${anchorLabel(anchor)}`);
    });
    return h("div", { class: "review-new" }, h("label", { for: "review-new-comment" },
      "New comment"), body, h("div", {}, choice, " ",
      h("button", { type: "button", onclick: submit }, "Add comment")));
  }

  function decisionBar(review) {
    const isAuthor = me.user && me.user === review.author;
    const decide = (decision) => act(() => api(`${base}/review/decision`,
      { method: "POST", body: { decision } }));
    const members = h("select", { "aria-label": "reviewer to ask" });
    api("/api/members").then((all) => members.replaceChildren(...all
      .filter((m) => m.name !== review.author && m.name !== me.user)
      .map((m) => h("option", { value: m.name }, m.name)))).catch(() => {});
    return h("div", { class: "review-decide" },
      h("span", {}, members, " ", h("button", { type: "button", class: "secondary",
        onclick: () => act(() => api(`${base}/review/requests`,
          { method: "POST", body: { reviewers: [members.value] } })) }, "Request review")),
      isAuthor || !me.user ? null : [
        h("button", { type: "button", onclick: () => decide("approve") }, "Approve plan"),
        h("button", { type: "button", class: "secondary", onclick: () => decide("request_changes") },
          "Request changes")],
      review.state === "approved" ? h("button", { type: "button", class: "secondary",
        onclick: () => act(async () => {
          const made = await api("/api/baselines", { method: "POST", body: { plan_id: planId } });
          toast(`plan ${planId} is now the baseline "${made.name}"`);
        }) }, "Make baseline") : null);
  }

  async function refresh() {
    const review = await api(`${base}/review`);
    if (signal.aborted) return;
    section.dataset.state = review.state;
    section.replaceChildren(
      h("h2", {}, "Review ", reviewBadge(review.state)),
      h("p", { class: "muted" }, `by ${review.author ?? "a team token"}`,
        review.reviewers.length ? ` · reviewers: ${review.reviewers.map((r) =>
          `${r.user} (${r.state.replace("_", " ")})`).join(", ")}` : ""),
      h("div", { class: "review-error", "aria-live": "polite" }),
      decisionBar(review),
      h("h3", {}, `Threads (${review.open_threads} open)`),
      h("ul", { class: "review-threads", "aria-label": "review threads" },
        review.threads.map((t) => threadView(t, review))),
      newThreadForm(),
      h("details", { class: "review-history" }, h("summary", {}, `History (${review.history.length})`),
        h("ol", {}, review.history.map((e) => h("li", {},
          `${e.created_at?.slice(0, 19).replace("T", " ") ?? ""} · ${e.actor ?? "?"} · ` +
          `${e.kind.replace("_", " ")}`)))));
  }

  refresh().catch((err) => section.replaceChildren(h("h2", {}, "Review"), errorBox(err)));
  return section;
}
