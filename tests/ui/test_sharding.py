"""The sharding diagram: rank cells on the mesh, a rank's block on hover and focus, replicate
and partial markers, permalinks, one panel per index of a third mesh axis."""

from __future__ import annotations

import json
from typing import Any

from playwright.sync_api import Page, expect

from tests.ui.conftest import TINY_LLAMA, Server, create_plan, screenshot

DOWN = "layers.0.mlp.down_proj.weight"


def _shape(shape: list[int]) -> str:
    return " × ".join(f"{n:,}" for n in shape)


def _range(rg: list[int]) -> str:
    return f"[{rg[0]:,}, {rg[1]:,})"


def test_grid_hover_and_permalink(page: Page, server: Server, built_plan: dict[str, Any]) -> None:
    plan_id = built_plan["id"]
    blocks = server.api("GET", f"/api/plans/{plan_id}/blocks/{DOWN}")
    page.goto(f"/#/plans/{plan_id}/sharding?value={DOWN}")
    expect(page.get_by_role("link", name="sharding")).to_have_attribute("aria-current", "page")
    expect(page.get_by_label("Value")).to_have_value(DOWN)
    cells = page.locator(".sh-cell")
    expect(cells).to_have_count(4)
    expect(page.locator(".sh-panel")).to_have_count(1)
    diagram = page.locator(".sh-panels")
    for text in ("dp ↓", "tp →", "dp=0", "dp=1", "tp=0", "tp=1"):
        expect(diagram.get_by_text(text, exact=True)).to_have_count(1)
    expect(page.locator("[data-field=spec]")).to_have_text("RS(0)")

    # hovering rank 1 shows its block exactly as the API has it
    one = next(r for r in blocks["ranks"] if r["rank"] == 1)
    page.locator('.sh-cell[data-rank="1"]').hover()
    detail = page.locator("#rank-detail")
    expect(detail.get_by_role("heading")).to_have_text("Rank 1")
    expect(detail.locator("[data-field=coord]")).to_have_text("dp=0, tp=1")
    expect(detail.locator("[data-field=local-shape]")).to_have_text(_shape(one["local_shape"]))
    for d, rg in enumerate(one["ranges"]):
        expect(detail.locator(f"tr[data-dim='{d}'] td").nth(1)).to_have_text(_range(rg))
    expect(detail.locator("[data-field=replicas]")).to_contain_text("ranks 1, 3")
    assert "rank=1" in page.url and "value=layers.0.mlp.down_proj.weight" in page.url

    # replicated over dp: every cell marked R, replicas drawn alike; nothing partial
    expect(page.locator(".sh-cell[data-kind=replicate]")).to_have_count(4)
    expect(page.locator("[data-marker=R]")).to_have_count(4)
    fills = [
        page.locator(f'.sh-cell[data-rank="{r}"] .sh-block').get_attribute("fill") for r in range(4)
    ]
    assert fills[0] == fills[2] != fills[1] == fills[3]
    assert not any("url(" in (f or "") for f in fills)

    # keyboard: cells are focusable, focus shows the rank, arrows move between cells
    page.locator('.sh-cell[data-rank="2"]').focus()
    expect(detail.get_by_role("heading")).to_have_text("Rank 2")
    page.keyboard.press("ArrowRight")
    expect(detail.get_by_role("heading")).to_have_text("Rank 3")
    expect(page.get_by_role("button", name="rank 3 (dp=1, tp=1)")).to_be_focused()

    # the permalink reopens value and rank
    page.goto(f"/#/plans/{plan_id}/sharding?value={DOWN}&rank=3")
    expect(page.locator("#rank-detail h2")).to_have_text("Rank 3")
    expect(page.locator('.sh-cell[data-rank="3"]')).to_have_class("sh-cell sh-selected")
    screenshot(page, "sharding")


def test_partial_values_are_hatched(page: Page, built_plan: dict[str, Any]) -> None:
    plan_id = built_plan["id"]
    # the weight gradient before its dp all-reduce: a partial sum over dp
    page.goto(f"/#/plans/{plan_id}/sharding?value={DOWN}.grad")
    expect(page.locator("[data-field=spec]")).to_have_text("P(sum)S(0)")
    expect(page.locator(".sh-cell[data-kind=partial]")).to_have_count(4)
    expect(page.locator("[data-marker='P(sum)']")).to_have_count(4)
    fill = page.locator('.sh-cell[data-rank="0"] .sh-block').get_attribute("fill")
    assert fill is not None and fill.startswith("url(#sh-hatch-")
    page.locator('.sh-cell[data-rank="2"]').hover()
    expect(page.locator("[data-field=partial]")).to_have_text(
        "P(sum) over dp: reduce with ranks 0, 2"
    )
    # its partial group is framed with it
    expect(page.locator('.sh-cell[data-rank="0"]')).to_have_class("sh-cell sh-peer")
    expect(page.locator("#view")).to_contain_text("partial: the rank holds a partial value")

    # choosing another value in the picker redraws and records it in the URL
    picker = page.get_by_label("Value")
    picker.fill("layers.0.mlp.up_proj")
    picker.press("Enter")
    expect(page.locator("[data-field=spec]")).to_have_text("S(0)S(2)")
    expect(page.locator(".sh-cell[data-kind=shard]")).to_have_count(4)
    assert "value=layers.0.mlp.up_proj" in page.url

    picker.fill("no.such.value")
    picker.press("Enter")
    expect(page.get_by_role("alert")).to_contain_text("no value 'no.such.value'")
    expect(picker).to_have_attribute("aria-invalid", "true")


def test_default_value_is_a_sharded_weight(page: Page, built_plan: dict[str, Any]) -> None:
    page.goto(f"/#/plans/{built_plan['id']}/sharding")
    expect(page.locator(".sh-cell")).to_have_count(4)
    expect(page.get_by_label("Value")).to_have_value("embed.weight")
    expect(page.locator("[data-field=spec]")).to_have_text("RS(0)")


def test_three_axis_mesh_has_a_panel_per_slice(page: Page, server: Server) -> None:
    strategy = {"name": "ui-3d", "mesh": "dp=2,tp=2,sp=2", "templates": ["dp", "megatron_tp"]}
    plan = create_plan(server, "ui-tiny", strategy, "h100-sxm-1x8", TINY_LLAMA)
    page.goto(f"/#/plans/{plan['id']}/sharding?value={DOWN}")
    panels = page.locator(".sh-panel")
    expect(panels).to_have_count(2)
    expect(panels.nth(0).locator("figcaption")).to_have_text("sp=0")
    expect(panels.nth(1).locator("figcaption")).to_have_text("sp=1")
    expect(page.locator(".sh-cell")).to_have_count(8)
    expect(panels.nth(1).locator(".sh-cell")).to_have_count(4)
    # rank 5 = (dp 1, tp 0, sp 1): in the second panel
    expect(panels.nth(1).locator('.sh-cell[data-rank="5"]')).to_have_count(1)
    page.locator('.sh-cell[data-rank="5"]').hover()
    expect(page.locator("[data-field=coord]")).to_have_text("dp=1, tp=0, sp=1")
    expect(page.locator("[data-field=replicas]")).to_contain_text("ranks 0, 1, 4, 5")


#: a tiny llama whose heads split 8 ways
TINY_8_HEADS = {**TINY_LLAMA, "heads": 8, "kv_heads": 8}

#: per cell, the boxes of its label and markers, and of its frame (page coordinates)
BOXES = """() => [...document.querySelectorAll('.sh-cell')].map((cell) => {
    const box = (el) => { const r = el.getBoundingClientRect();
                          return [r.left, r.top, r.right, r.bottom]; };
    return { rank: cell.dataset.rank, frame: box(cell.querySelector('.sh-frame')),
             texts: [...cell.querySelectorAll('.sh-label, .sh-marker')].map(box) };
})"""


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_an_8x8_mesh_labels_never_collide_and_has_a_heat_map(page: Page, server: Server) -> None:
    strategy = {"name": "ui-8x8", "mesh": "dp=8,tp=8", "templates": ["dp", "megatron_tp"]}
    plan = create_plan(server, "ui-tiny-8-heads", strategy, "h100-sxm-8x8", TINY_8_HEADS)
    page.goto(f"/#/plans/{plan['id']}/sharding?value={DOWN}")
    expect(page.locator(".sh-cell")).to_have_count(64)
    expect(page.locator("[data-marker=R]")).to_have_count(64)
    cells = page.evaluate(BOXES)
    assert len(cells) == 64
    for cell in cells:
        texts = cell["texts"]
        assert len(texts) == 2, cell
        for i, a in enumerate(texts):
            # inside the cell's frame, and clear of every other label of the cell
            f = cell["frame"]
            assert f[0] <= a[0] and a[2] <= f[2] and f[1] <= a[1] and a[3] <= f[3], cell
            for b in texts[i + 1 :]:
                assert not _overlap(a, b), cell
    screenshot(page, "sharding_8x8")

    # more than 16 ranks: the compact mode, a heat map of the block index by rank
    toggle = page.get_by_role("button", name="Compact: heat map of block index")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true")
    heat = page.locator(".sh-heatmap")
    expect(heat).to_be_visible()
    expect(heat.locator(".sh-heat-cell")).to_have_count(64)
    assert "compact=1" in page.url
    blocks = server.api("GET", f"/api/plans/{plan['id']}/blocks/{DOWN}")
    distinct = {json.dumps(r["ranges"]) for r in blocks["ranks"]}
    numbers = {c.get_attribute("data-block") for c in heat.locator(".sh-heat-cell").all()}
    assert len(numbers) == len(distinct) == 8  # split over tp, replicated over dp
    # replicas (same tp index, any dp) share the block's number
    assert heat.locator('[data-rank="1"]').get_attribute("data-block") == heat.locator(
        '[data-rank="9"]'
    ).get_attribute("data-block")
    expect(page.locator(".sh-heat-legend")).to_contain_text("8 distinct blocks")
    heat.locator('[data-rank="10"]').hover()
    expect(page.locator("#rank-detail h2")).to_have_text("Rank 10")
    screenshot(page, "sharding_heat")

    # the permalink keeps the mode; toggling back draws the cells
    page.goto(f"/#/plans/{plan['id']}/sharding?value={DOWN}&compact=1")
    expect(page.locator(".sh-heatmap")).to_be_visible()
    page.get_by_role("button", name="Compact: heat map of block index").click()
    expect(page.locator(".sh-heatmap")).to_have_count(0)
    expect(page.locator(".sh-frame")).to_have_count(64)
    expect(page.locator("#view")).not_to_contain_text("null")


def test_a_small_mesh_has_no_compact_mode(page: Page, built_plan: dict[str, Any]) -> None:
    page.goto(f"/#/plans/{built_plan['id']}/sharding?value={DOWN}&compact=1")
    expect(page.locator(".sh-cell")).to_have_count(4)
    expect(page.locator(".sh-heatmap")).to_have_count(0)
    expect(page.get_by_role("button", name="Compact: heat map of block index")).to_be_hidden()


def test_uneven_blocks_show_each_ranks_own_shape(page: Page, server: Server) -> None:
    """A vocab of 257 over tp=2 and a batch of 6 over dp=4 (DTensor-style uneven blocks):
    the diagram says the blocks are uneven and each rank's cell has its own rows."""
    odd = {**TINY_LLAMA, "vocab": 257, "batch": 6}
    strategy = {"name": "ui-uneven", "mesh": "dp=2,tp=2", "templates": ["dp", "megatron_tp"]}
    plan = create_plan(server, "ui-uneven", strategy, "h100-sxm-1x4", odd)
    value = "embed.weight"
    blocks = server.api("GET", f"/api/plans/{plan['id']}/blocks/{value}")
    assert blocks["even"] is False
    rows = {r["rank"]: r["local_shape"][0] for r in blocks["ranks"]}
    assert sorted(set(rows.values())) == [128, 129]  # 257 = 129 + 128 over tp
    page.goto(f"/#/plans/{plan['id']}/sharding?value={value}")
    expect(page.locator("[data-field=uneven]")).to_contain_text("the last blocks are short")
    detail = page.locator("#rank-detail")
    for rank in (0, 1):
        page.locator(f'.sh-cell[data-rank="{rank}"]').hover()
        expect(detail.get_by_role("heading")).to_have_text(f"Rank {rank}")
        mine = next(r for r in blocks["ranks"] if r["rank"] == rank)
        expect(detail.locator("[data-field=local-shape]")).to_have_text(_shape(mine["local_shape"]))
        expect(detail.locator("tr[data-dim='0'] td").nth(1)).to_have_text(_range(mine["ranges"][0]))
