"""`GET /api/plans/{id}/export`: a built plan as a DTensor module, torchtitan 0.3 arguments,
torchtitan TOML (before 0.3), Megatron-LM arguments or JSON."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from backend.settings import Settings
from shardlab.models import build_model
from shardlab.plan import build_plan
from shardlab.strategy import Strategy
from tests.api.conftest import assert_error
from tests.api.test_plans import TINY, run_jobs, setup_plan


def _export(client: TestClient, plan_id: int, fmt: str) -> tuple[str, str, list[str]]:
    answer = client.get(f"/api/plans/{plan_id}/export", params={"format": fmt})
    assert answer.status_code == 200, answer.text
    disposition = answer.headers["content-disposition"]
    assert disposition.startswith("attachment; filename=")
    return answer.text, disposition, json.loads(answer.headers["x-export-notes"])


def test_exports_of_a_built_plan(
    client: TestClient, other_client: TestClient, settings: Settings
) -> None:
    plan_id = setup_plan(client)  # tiny llama, dp=2,tp=2, templates dp + megatron_tp
    assert_error(client.get(f"/api/plans/{plan_id}/export"), 409, "not_ready")
    assert run_jobs(settings) == 1

    module, disposition, notes = _export(client, plan_id, "dtensor")
    assert f'filename="plan{plan_id}_parallelize.py"' in disposition and notes == []
    compile(module, "parallelize.py", "exec")  # valid Python
    assert '"embed": RowwiseParallel(input_layouts=Replicate())' in module
    assert '"layers.1.attn.q_proj": ColwiseParallel()' in module
    assert '"layers.0.mlp.down_proj": RowwiseParallel()' in module
    assert '"lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)' in module
    assert "replicate(model, mesh=mesh[DATA_AXES[0]], mp_policy=mp)" in module

    args, disposition, notes = _export(client, plan_id, "torchtitan")
    assert f'filename="plan{plan_id}_torchtitan.args"' in disposition
    for line in ("--module llama3", "--parallelism.data_parallel_replicate_degree 2",
                 "--parallelism.data_parallel_shard_degree 1",
                 "--parallelism.tensor_parallel_degree 2", "--training.local_batch_size 2",
                 "activation-checkpoint:none"):  # fmt: skip
        assert line in args.splitlines(), args
    assert any("no DDP wrapper" in n for n in notes)  # DDP x TP, mapped and said

    megatron, disposition, _ = _export(client, plan_id, "megatron")
    assert f'filename="plan{plan_id}_megatron.args"' in disposition
    assert "--tensor-model-parallel-size 2" in megatron.splitlines()
    assert "--micro-batch-size 2" in megatron.splitlines()

    toml, disposition, _ = _export(client, plan_id, "torchtitan-toml")
    assert f'filename="plan{plan_id}_torchtitan.toml"' in disposition
    for line in ("data_parallel_replicate_degree = 2", "data_parallel_shard_degree = 1",
                 "tensor_parallel_degree = 2", "pipeline_parallel_degree = 1",
                 "local_batch_size = 2", 'mode = "none"'):  # fmt: skip
        assert line in toml.splitlines(), toml

    text, disposition, _ = _export(client, plan_id, "json")
    assert f'filename="plan{plan_id}_placements.json"' in disposition
    exported = json.loads(text)
    params = {p["name"]: p for p in exported["parameters"]}
    # the same plan built here: every parameter, and its placements through the layout rule
    local = build_plan(
        build_model("llama3-8b", TINY), Strategy.build("dp=2,tp=2", ["dp", "megatron_tp"])
    )
    spec = local.completed.specs
    assert set(params) == {v.name for v in local.model.values.values() if v.kind.value == "param"}
    q = params["layers.0.attn.q_proj.weight"]
    assert str(spec[q["name"]]) == "RS(1)"  # [in, out] column-parallel in the plan
    assert q["placements"] == {"dp": "R", "tp": "S(0)"} and q["transposed"] is True
    assert q["shape"] == [64, 64] and exported["mesh"]["axes"] == ["dp", "tp"]
    assert params["embed.weight"]["placements"] == {"dp": "R", "tp": "S(0)"}
    assert params["layers.0.mlp.down_proj.weight"]["shape"] == [64, 128]  # torch [out, in]

    assert_error(
        client.get(f"/api/plans/{plan_id}/export", params={"format": "onnx"}),
        422, "export_error", "onnx", "dtensor",
    )  # fmt: skip
    assert_error(other_client.get(f"/api/plans/{plan_id}/export"), 404, "not_found")
    assert_error(client.get("/api/plans/999999/export"), 404, "not_found")


def test_a_plan_with_a_partial_parameter_is_refused(client: TestClient, settings: Settings) -> None:
    model = {"name": "tiny", "preset": "llama3-8b", "overrides": TINY}
    model_id = client.post("/api/models", json=model).json()["id"]
    strategy = client.post(
        "/api/strategies",
        json={"name": "partial", "mesh": "tp=2", "templates": ["megatron_tp"],
              "annotations": ["layers.0.mlp.up_proj.weight=tp:P(sum)"]},
    ).json()  # fmt: skip
    created = client.post("/api/plans", json={"model_id": model_id, "strategy_id": strategy["id"]})
    assert created.status_code == 202, created.text
    plan_id = created.json()["id"]
    assert run_jobs(settings) == 1
    body = assert_error(
        client.get(f"/api/plans/{plan_id}/export", params={"format": "json"}),
        422, "export_error", "layers.0.mlp.up_proj.weight", "P(sum)",
    )  # fmt: skip
    assert body["detail"] == {
        "value": "layers.0.mlp.up_proj.weight", "axis": "tp", "placement": "P(sum)"
    }  # fmt: skip
