"""The plan form: model, cluster, mesh, templates, annotations -> a plan built live."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.ui.conftest import TINY_LLAMA, Server, screenshot
from tests.ui.refusals import api_error, error_of, refusing_page

#: records what the job box shows while the job runs (the view leaves for the plan page)
WATCH_PROGRESS = """() => {
  window.seenProgress = [];
  new MutationObserver(() => {
    const bar = document.querySelector('progress[aria-label="plan job progress"]');
    const box = bar && bar.closest("section");
    if (bar && box && !box.hidden) {
      window.seenProgress.push(document.getElementById("plan-job-message").textContent);
    }
  }).observe(document.body, { subtree: true, childList: true, attributes: true,
                              characterData: true });
}"""


@pytest.fixture
def page(browser: Browser, server: Server, storage_state: str) -> Iterator[Page]:
    """A logged-in page that lets the 409/422 answers these tests provoke through."""
    yield from refusing_page(browser, server, storage_state)


def model_id(server: Server, name: str, preset: str, overrides: dict[str, Any]) -> int:
    """The id of the team's model `name`, created from the preset if missing."""
    for m in server.api("GET", "/api/models"):
        if m["name"] == name:
            return int(m["id"])
    body = {"name": name, "preset": preset, "overrides": overrides}
    return int(server.api("POST", "/api/models", body)["id"])


def fill(page: Page, model: int, cluster: str, mesh: list[tuple[str, int]],
         templates: tuple[str, ...] = (), annotations: str = "") -> None:  # fmt: skip
    """Fill the form (on #/plans/new) without submitting it."""
    page.get_by_label("Model").select_option(str(model))
    page.get_by_label("Cluster").fill(cluster)
    while page.get_by_role("button", name=re.compile("^Remove mesh axis")).count() > len(mesh):
        page.get_by_role("button", name=re.compile("^Remove mesh axis")).last.click()
    for i, (axis, size) in enumerate(mesh, start=1):
        if page.get_by_label(f"Axis {i} name").count() == 0:
            page.get_by_role("button", name="Add axis").click()
        page.get_by_label(f"Axis {i} name").fill(axis)
        page.get_by_label(f"Axis {i} size").fill(str(size))
    for name in templates:
        page.get_by_label(name, exact=True).check()
    page.get_by_label("Annotations").fill(annotations)


def plan_count(server: Server) -> int:
    return len(server.api("GET", "/api/plans"))


def test_a_plan_from_the_form_is_built_live(page: Page, server: Server) -> None:
    tiny = model_id(server, "plan-new-tiny", "llama3-8b", TINY_LLAMA)
    page.goto("/#/plans/new")
    fill(page, tiny, "h100-sxm-1x4", [("dp", 2), ("tp", 2)], ("dp", "megatron_tp"))
    expect(page.get_by_text("4 devices (1 node × 4)")).to_be_visible()
    expect(
        page.get_by_text("mesh dp=2,tp=2: 2 × 2 = 4 devices, matches the 4 devices")
    ).to_be_visible()
    # a template's mesh axis is one of the mesh's
    axis = page.get_by_label("mesh axis of template megatron_tp")
    expect(axis.locator("option")).to_have_text(["default (tp)", "dp", "tp"])
    screenshot(page, "plan_new")

    page.evaluate(WATCH_PROGRESS)
    page.get_by_role("button", name="Create plan").click()
    expect(page).to_have_url(re.compile(r"#/plans/\d+$"), timeout=60_000)
    seen: list[str] = page.evaluate("window.seenProgress")
    assert seen and seen[-1] == "succeeded", seen
    plan_id = int(page.url.rsplit("/", 1)[1])
    plan = server.api("GET", f"/api/plans/{plan_id}")
    assert plan["status"] == "succeeded" and plan["cluster"] == "h100-sxm-1x4"
    assert plan["model_id"] == tiny
    strategy = server.api("GET", f"/api/strategies/{plan['strategy_id']}")
    assert strategy["mesh"] == "dp=2,tp=2"
    assert strategy["templates"] == ["dp", "megatron_tp"] and strategy["annotations"] == []
    # named readably: mesh and templates, no time stamp
    assert re.fullmatch(r"dp=2,tp=2 dp\+megatron_tp( \(\d+\))?", strategy["name"]), strategy
    expect(page.locator("#view")).to_contain_text("succeeded")


def test_a_mesh_larger_than_the_cluster_is_shown_at_the_mesh(page: Page, server: Server) -> None:
    tiny = model_id(server, "plan-new-tiny", "llama3-8b", TINY_LLAMA)
    before = plan_count(server)
    page.goto("/#/plans/new")
    fill(page, tiny, "h100-sxm-1x4", [("dp", 8)], ("dp",))
    expect(page.get_by_text("more than the 4 devices of h100-sxm-1x4")).to_be_visible()
    page.get_by_role("button", name="Create plan").click()
    size = page.get_by_label("Axis 1 size")
    expect(size).to_have_attribute("aria-invalid", "true")
    expect(error_of(page, size)).to_contain_text("has 8 devices but cluster 'h100-sxm-1x4' has 4")
    expect(page.get_by_label("Cluster")).not_to_have_attribute("aria-invalid", "true")
    assert plan_count(server) == before


def test_a_template_without_its_axis_is_shown_at_the_templates(page: Page, server: Server) -> None:
    tiny = model_id(server, "plan-new-tiny", "llama3-8b", TINY_LLAMA)
    before = plan_count(server)
    page.goto("/#/plans/new")
    fill(page, tiny, "h100-sxm-1x4", [("x", 2), ("y", 2)], ("megatron_tp",))
    # said before submitting: the template works on tp, which the mesh lacks
    expect(page.locator("#templates-warning")).to_have_text(
        "megatron_tp works on mesh axis tp, which this mesh lacks (axes x, y): choose its axis "
        "or add one of that name."
    )
    page.get_by_role("button", name="Create plan").click()
    box = page.get_by_label("megatron_tp", exact=True)
    expect(box).to_have_attribute("aria-invalid", "true")
    probe = {"name": "plan-new-probe", "mesh": "x=2,y=2", "templates": ["megatron_tp"]}
    expected = api_error(server, "POST", "/api/strategies", probe)
    expect(error_of(page, box)).to_have_text(expected["message"])
    expect(page.get_by_label("dp", exact=True)).not_to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("Axis 1 name")).not_to_have_attribute("aria-invalid", "true")
    assert plan_count(server) == before


def test_annotation_errors_name_the_line(page: Page, server: Server) -> None:
    tiny = model_id(server, "plan-new-tiny", "llama3-8b", TINY_LLAMA)
    before = plan_count(server)
    page.goto("/#/plans/new")
    # an unknown mesh axis: refused by POST /api/strategies
    bad = "layers.*.mlp.up_proj.weight=zz:S(1)"
    fill(page, tiny, "h100-sxm-1x4", [("dp", 2), ("tp", 2)], ("dp",),
         f"embed.weight=tp:S(0)\n{bad}")  # fmt: skip
    page.get_by_role("button", name="Create plan").click()
    annotations = page.get_by_label("Annotations")
    expect(annotations).to_have_attribute("aria-invalid", "true")
    line = error_of(page, annotations)
    expect(line).to_contain_text(f"line 2 ({bad}): annotation '{bad}': unknown mesh axis 'zz'")
    expect(annotations).to_be_focused()

    # a glob that matches no value: refused by POST /api/plans, on the line that wrote it
    annotations.fill("embed.weight=tp:S(0)\n\nno_such_value=dp:S(0)")
    page.get_by_role("button", name="Create plan").click()
    expect(line).to_contain_text("line 3 (no_such_value=dp:S(0)): annotation 'no_such_value=")
    expect(line).to_contain_text("matches no value")
    assert plan_count(server) == before


def test_cancel_a_running_plan(page: Page, server: Server) -> None:
    big = model_id(server, "plan-new-llama3-8b", "llama3-8b", {})
    page.goto("/#/plans/new")
    fill(page, big, "h100-sxm-8x8", [("dp", 8), ("tp", 8)], ("dp", "megatron_tp"))
    page.get_by_role("button", name="Create plan").click()
    message = page.locator("#plan-job-message")
    expect(page.get_by_role("progressbar", name="plan job progress")).to_be_visible()
    expect(message).to_contain_text("running", timeout=30_000)
    page.get_by_role("button", name="Cancel").click()
    expect(message).to_have_text("cancelled", timeout=30_000)
    expect(page.get_by_role("button", name="Cancel")).to_be_hidden()
    link = page.get_by_role("link", name=re.compile(r"^plan #\d+$"))
    plan_id = int(link.inner_text().rsplit("#", 1)[1])
    assert server.api("GET", f"/api/plans/{plan_id}")["status"] == "cancelled"
    # the form's choices are in the URL (a permalink to the same form)
    assert page.url.endswith(f"#/plans/new?model={big}&cluster=h100-sxm-8x8&mesh=dp%3D8%2Ctp%3D8")


def test_recomputation_and_a_pipeline_from_the_form(page: Page, server: Server) -> None:
    """The recompute control and, once the mesh has a pp axis, the pipeline's schedule go into
    the strategy's options; the built plan reports its memory per pipeline stage."""
    tiny = model_id(server, "plan-new-tiny", "llama3-8b", TINY_LLAMA)
    page.goto("/#/plans/new")
    fill(page, tiny, "h100-sxm-1x4", [("dp", 2), ("tp", 2)], ("dp",))
    pipeline = page.get_by_role("group", name="Pipeline (mesh axis pp)")
    expect(pipeline).to_be_hidden()
    page.get_by_label("Activation recomputation").select_option("selective")
    fill(page, tiny, "h100-sxm-1x4", [("pp", 2), ("dp", 2)], ("dp",))
    expect(pipeline).to_be_visible()
    virtual = page.get_by_label("Virtual stages (layer chunks per pipeline stage)")
    page.get_by_label("Schedule").select_option("interleaved")
    expect(virtual).to_be_visible()  # only the interleaved schedule has virtual stages
    page.get_by_label("Schedule").select_option("1f1b")
    expect(virtual).to_be_hidden()
    page.get_by_label("Micro-batches per step").fill("4")
    page.get_by_label("Layers per stage").select_option("even")
    page.get_by_role("button", name="Create plan").click()
    expect(page).to_have_url(re.compile(r"#/plans/\d+$"), timeout=60_000)
    plan = server.api("GET", f"/api/plans/{int(page.url.rsplit('/', 1)[1])}")
    strategy = server.api("GET", f"/api/strategies/{plan['strategy_id']}")
    assert strategy["options"]["recompute"] == "selective"
    assert strategy["options"]["pipeline"] == {"schedule": "1f1b", "balance": "even",
                                               "microbatches": 4}  # fmt: skip
    stages = plan["summary"]["pipeline"]["stages"]
    assert [s["layers"] for s in stages] == [[0], [1]]
    assert [s["memory"]["in_flight"] for s in stages] == [[2], [1]]
    table = page.get_by_role("table", name="pipeline stages")
    expect(table.locator("tbody tr")).to_have_count(2)
    expect(table.locator("tbody tr").first).to_contain_text("(2)")  # 2 micro-batches in flight
    expect(page.get_by_role("region", name="pipeline")).to_contain_text("bubble")


def test_gradient_accumulation_from_the_form(page: Page, server: Server) -> None:
    """On a mesh without a pp axis the form offers gradient accumulation: the strategy gets
    option `microbatches`, and the plan page shows the step as micro-batches plus what
    follows the last one, with the activations of one micro-batch."""
    tiny = model_id(server, "plan-new-tiny", "llama3-8b", TINY_LLAMA)
    page.goto("/#/plans/new")
    fill(page, tiny, "h100-sxm-1x4", [("pp", 2), ("dp", 2)], ("dp",))
    accumulate = page.get_by_label("Gradient accumulation steps")
    expect(accumulate).to_be_hidden()  # a pipeline counts its own micro-batches
    fill(page, tiny, "h100-sxm-1x4", [("dp", 2)], ())
    expect(accumulate).to_be_visible()
    accumulate.fill("2")
    page.get_by_role("button", name="Create plan").click()
    expect(page).to_have_url(re.compile(r"#/plans/\d+$"), timeout=60_000)
    plan = server.api("GET", f"/api/plans/{int(page.url.rsplit('/', 1)[1])}")
    strategy = server.api("GET", f"/api/strategies/{plan['strategy_id']}")
    assert strategy["mesh"] == "dp=2" and strategy["options"]["microbatches"] == 2
    section = page.get_by_role("region", name="gradient accumulation")
    expect(section).to_contain_text("2 micro-batches one after another")
    expect(section).to_contain_text("(one micro-batch)")
    screenshot(page, "plan_accumulation")


def test_batch_and_sequence_length_make_the_model(page: Page, server: Server) -> None:
    tiny = model_id(server, "plan-new-tiny", "llama3-8b", TINY_LLAMA)
    page.goto("/#/plans/new")
    fill(page, tiny, "h100-sxm-1x4", [("dp", 2), ("tp", 2)], ("dp", "megatron_tp"))
    batch = page.get_by_label("Batch size (sequences per step)")
    seq = page.get_by_label("Sequence length (tokens)")
    expect(batch).to_have_attribute("placeholder", f"model: {TINY_LLAMA['batch']}")
    expect(seq).to_have_attribute("placeholder", f"model: {TINY_LLAMA['seq']}")
    batch.fill("16")
    seq.fill("512")
    page.get_by_role("button", name="Create plan").click()
    expect(page).to_have_url(re.compile(r"#/plans/\d+$"), timeout=60_000)
    plan = server.api("GET", f"/api/plans/{int(page.url.rsplit('/', 1)[1])}")
    model = server.api("GET", f"/api/models/{plan['model_id']}")
    assert model["overrides"] == {**TINY_LLAMA, "batch": 16, "seq": 512}, model
    assert model["summary"]["config"]["batch"] == 16 and model["summary"]["config"]["seq"] == 512
    assert plan["model_id"] != tiny

    # the same values again reuse that model; a bad one is shown at the fields
    page.goto(f"/#/plans/new?model={tiny}&mesh=dp=4&templates=dp&batch=16&seq=512")
    expect(page.get_by_label("Batch size (sequences per step)")).to_have_value("16")
    expect(page.get_by_label("dp", exact=True)).to_be_checked()
    page.get_by_label("Sequence length (tokens)").fill("0")
    page.get_by_role("button", name="Create plan").click()
    bad = page.get_by_label("Sequence length (tokens)")
    expect(bad).to_have_attribute("aria-invalid", "true")
    expect(error_of(page, bad)).to_contain_text("seq")
