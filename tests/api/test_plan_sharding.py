"""The sharding diagram's data: a plan's values and the block of a value each rank holds.

The tiny llama plan is dp=2 x tp=2 (ranks row-major: rank = 2 * dp + tp) under the dp and
megatron_tp templates, built by the in-process worker. The numbers themselves are checked
against the simulated mesh's execution in tests/shardlab/test_blocks.py; here: the API's
answers for known values, exact tiling, groups, errors and team isolation.
"""

from __future__ import annotations

import math
from itertools import product
from typing import Any

from fastapi.testclient import TestClient

from backend.settings import Settings
from tests.api.test_plans import TINY, _created, run_jobs, setup_plan

DOWN = "layers.0.mlp.down_proj.weight"


def check_tiles(blocks: dict[str, Any]) -> None:
    """One rank of each replica group x partial group holds each block: those blocks tile
    the global tensor exactly (their sizes add up to it and no two overlap); each rank's
    local shape is its ranges' extent; groups contain their rank and are symmetric."""
    shape = blocks["shape"]
    ranks = {r["rank"]: r for r in blocks["ranks"]}
    assert sorted(ranks) == list(range(math.prod(a["size"] for a in blocks["mesh"]["axes"])))
    tiles: dict[tuple[tuple[int, int], ...], set[int]] = {}
    for r in ranks.values():
        assert r["local_shape"] == [b - a for a, b in r["ranges"]]
        assert all(m <= big for m, big in zip(r["local_shape"], blocks["local_shape"], strict=True))
        assert all(0 <= a < b <= n for (a, b), n in zip(r["ranges"], shape, strict=True))
        tiles.setdefault(tuple(map(tuple, r["ranges"])), set()).add(r["rank"])
        for group in ("replica_group", "partial_group"):
            assert r["rank"] in r[group]
            assert all(ranks[o][group] == r[group] for o in r[group])
        # the ranks holding this block: its replicas, each with its partial group
        assert len(r["replica_group"]) * len(r["partial_group"]) == len(
            {o for p in r["replica_group"] for o in ranks[p]["partial_group"]}
        )
    assert sum(math.prod(b - a for a, b in tile) for tile in tiles) == math.prod(shape)
    for one, two in product(tiles, repeat=2):
        if one != two:
            assert any(b1 <= a2 or b2 <= a1 for (a1, b1), (a2, b2) in zip(one, two, strict=True))
    for tile, holders in tiles.items():
        r = ranks[min(holders)]
        held = {o for p in r["replica_group"] for o in ranks[p]["partial_group"]}
        assert held == holders, tile


def test_values_and_blocks(
    client: TestClient, other_client: TestClient, settings: Settings
) -> None:
    plan_id = setup_plan(client, "h100-sxm-1x4")
    early = client.get(f"/api/plans/{plan_id}/blocks/{DOWN}")
    assert early.status_code == 409 and early.json()["code"] == "not_ready"
    assert run_jobs(settings) == 1

    listing = client.get(f"/api/plans/{plan_id}/values")
    assert listing.status_code == 200, listing.text
    body = listing.json()
    assert body["mesh"] == {
        "text": "dp=2,tp=2",
        "axes": [{"name": "dp", "size": 2}, {"name": "tp", "size": 2}],
        "ranks": [0, 1, 2, 3],
    }
    values = {v["name"]: v for v in body["values"]}
    assert values[DOWN] == {
        "name": DOWN,
        "spec": "RS(0)",
        "shape": [TINY["ffn"], TINY["hidden"]],
        "dtype": "bfloat16",
        "kind": "param",
    }
    # every value the placements view knows, with the same spec
    for name in (DOWN, "layers.0.mlp.down_proj", f"{DOWN}.grad", f"{DOWN}.exp_avg"):
        placed = client.get(f"/api/plans/{plan_id}/placements/{name}").json()
        assert values[name]["spec"] == placed["spec"]
    default = values[body["default"]]
    assert default["kind"] == "param" and "S(" in default["spec"]
    assert math.prod(default["shape"]) == max(
        math.prod(v["shape"]) for v in values.values() if v["kind"] == "param" and "S(" in v["spec"]
    )

    # the weight: S(0) over tp, replicated over dp
    down = client.get(f"/api/plans/{plan_id}/blocks/{DOWN}").json()
    assert (down["value"], down["spec"], down["shape"]) == (DOWN, "RS(0)", [128, 64])
    assert down["dtype"] == "bfloat16" and down["kind"] == "param"
    assert down["placements"] == [
        {"axis": "dp", "placement": "R", "kind": "replicate"},
        {"axis": "tp", "placement": "S(0)", "kind": "shard", "dim": 0},
    ]
    assert down["dims"] == [
        {"dim": 0, "size": 128, "axes": ["tp"]},
        {"dim": 1, "size": 64, "axes": []},
    ]
    assert [(r["rank"], r["coord"], r["ranges"]) for r in down["ranks"]] == [
        (0, [0, 0], [[0, 64], [0, 64]]),
        (1, [0, 1], [[64, 128], [0, 64]]),
        (2, [1, 0], [[0, 64], [0, 64]]),
        (3, [1, 1], [[64, 128], [0, 64]]),
    ]
    # replicas over dp: the ranks with the same tp coordinate
    assert [r["replica_group"] for r in down["ranks"]] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert all(r["partial"] == [] and r["partial_group"] == [r["rank"]] for r in down["ranks"])
    check_tiles(down)

    # a sharded activation: batch over dp, features over tp; no replicas
    act = client.get(f"/api/plans/{plan_id}/blocks/layers.0.mlp.up_proj").json()
    assert act["spec"] == "S(0)S(2)" and act["shape"] == [4, 16, 128]
    assert act["local_shape"] == [2, 16, 64]
    assert act["ranks"][2]["ranges"] == [[2, 4], [0, 16], [0, 64]]
    assert all(r["replica_group"] == [r["rank"]] for r in act["ranks"])
    check_tiles(act)

    # partial sums: the down projection's output over tp, the weight gradient over dp
    out = client.get(f"/api/plans/{plan_id}/blocks/layers.0.mlp.down_proj").json()
    assert out["spec"] == "S(0)P(sum)"
    assert out["placements"][1] == {
        "axis": "tp",
        "placement": "P(sum)",
        "kind": "partial",
        "op": "sum",
    }
    assert [r["partial_group"] for r in out["ranks"]] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert all(r["partial"] == [{"axis": "tp", "op": "sum"}] for r in out["ranks"])
    assert [r["ranges"][0] for r in out["ranks"]] == [[0, 2], [0, 2], [2, 4], [2, 4]]
    check_tiles(out)
    grad = client.get(f"/api/plans/{plan_id}/blocks/{DOWN}.grad").json()
    assert grad["spec"] == "P(sum)S(0)"
    assert [r["partial_group"] for r in grad["ranks"]] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert all(r["partial"] == [{"axis": "dp", "op": "sum"}] for r in grad["ranks"])
    check_tiles(grad)

    # a replicated norm weight: every rank holds all of it
    norm = client.get(f"/api/plans/{plan_id}/blocks/layers.0.mlp_norm.weight").json()
    assert norm["spec"] == "RR"
    assert all(
        r["ranges"] == [[0, 64]] and r["replica_group"] == [0, 1, 2, 3] for r in norm["ranks"]
    )
    check_tiles(norm)

    for missing in ("nope", "layers.0.mlp/down_proj.weight"):
        answer = client.get(f"/api/plans/{plan_id}/blocks/{missing}")
        assert answer.status_code == 404, answer.text
        assert answer.json()["code"] == "not_found" and repr(missing) in answer.json()["message"]
        assert answer.json()["detail"] == {"resource": "value", "value": missing}

    for path in ("/values", f"/blocks/{DOWN}", "/blocks/nope"):
        answer = other_client.get(f"/api/plans/{plan_id}{path}")
        assert answer.status_code == 404 and answer.json()["code"] == "not_found", path
        assert "plan" in answer.json()["message"]
    assert client.get("/api/plans/999999/values").status_code == 404


def test_uneven_blocks_have_each_ranks_own_ranges(client: TestClient, settings: Settings) -> None:
    """vocab 257 over tp=2 (129 + 128 rows) and a batch of 5 over dp=2 (3 + 2 sequences, the
    batch annotated: the dp template refuses a batch its axis does not divide)."""
    model = _created(
        client.post(
            "/api/models",
            json={
                "name": "odd",
                "preset": "llama3-8b",
                "overrides": {**TINY, "vocab": 257, "batch": 5},
            },
        )
    )
    strategy = _created(
        client.post(
            "/api/strategies",
            json={
                "name": "odd",
                "mesh": "dp=2,tp=2",
                "templates": ["megatron_tp"],
                "annotations": ["tokens=dp:S(0)", "labels=dp:S(0)"],
            },
        )
    )
    plan = _created(
        client.post(
            "/api/plans",
            json={
                "model_id": model["id"],
                "strategy_id": strategy["id"],
                "cluster": "h100-sxm-1x4",
            },
        )
    )
    assert run_jobs(settings) == 1
    plan_id = plan["id"]
    values = {v["name"]: v for v in client.get(f"/api/plans/{plan_id}/values").json()["values"]}
    table = next(n for n, v in values.items() if v["shape"] == [257, 64] and "S(0)" in v["spec"])
    blocks = client.get(f"/api/plans/{plan_id}/blocks/{table}").json()
    assert blocks["spec"] == "RS(0)" and blocks["even"] is False
    assert blocks["local_shape"] == [129, 64]  # the largest block
    assert [(r["ranges"][0], r["local_shape"]) for r in blocks["ranks"]] == [
        ([0, 129], [129, 64]), ([129, 257], [128, 64]),
        ([0, 129], [129, 64]), ([129, 257], [128, 64]),
    ]  # fmt: skip
    check_tiles(blocks)
    tokens = next(n for n, v in values.items() if v["kind"] == "input" and v["shape"] == [5, 16])
    batch = client.get(f"/api/plans/{plan_id}/blocks/{tokens}").json()
    assert batch["spec"].startswith("S(0)") and batch["local_shape"] == [3, 16]
    assert [r["ranges"][0] for r in batch["ranks"]] == [[0, 3], [0, 3], [3, 5], [3, 5]]
    check_tiles(batch)
