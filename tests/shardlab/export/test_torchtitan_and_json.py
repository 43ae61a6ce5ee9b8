"""`export.torchtitan_toml` (the TOML sections' values, torchtitan before 0.3),
`export.placements_json` (every parameter; the stored placements view) and
`shardlab export-plan` (files, stdout, errors)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.export.placements_json import parameter_placements, placements_view
from shardlab.export.torchtitan_toml import render_torchtitan_toml
from shardlab.ir import ValueKind
from shardlab.plan import save_plan
from tests.shardlab.export.test_dtensor_export import tiny_plan

runner = CliRunner()


def toml_of(plan: object) -> dict[str, dict[str, object]]:
    return tomllib.loads(render_torchtitan_toml(plan))  # type: ignore[arg-type]


def test_torchtitan_degrees_of_fsdp_tp_and_hsdp() -> None:
    got = toml_of(tiny_plan("dp=2,tp=2", ["fsdp", "megatron_tp", "sequence_parallel"]))
    assert got["parallelism"] == {
        "data_parallel_replicate_degree": 1,
        "data_parallel_shard_degree": 2,
        "tensor_parallel_degree": 2,
        "disable_loss_parallel": False,  # the plan's loss reads vocab-sharded logits
        "pipeline_parallel_degree": 1,
    }
    assert got["training"] == {"local_batch_size": 4, "seq_len": 16}
    assert got["activation_checkpoint"] == {"mode": "none"}
    hsdp = toml_of(tiny_plan("r=2,dp=2", ["dp:r", "fsdp:dp"], recompute="full"))
    assert hsdp["parallelism"]["data_parallel_replicate_degree"] == 2
    assert hsdp["parallelism"]["data_parallel_shard_degree"] == 2
    assert hsdp["parallelism"]["tensor_parallel_degree"] == 1
    assert hsdp["training"]["local_batch_size"] == 2
    assert hsdp["activation_checkpoint"] == {"mode": "full"}


def test_torchtitan_pipeline_schedule_microbatches_and_parts() -> None:
    plan = tiny_plan(
        "pp=2,tp=2", ["megatron_tp"], recompute="selective",
        pipeline={"schedule": "interleaved", "microbatches": 4, "virtual_stages": 1},
    )  # fmt: skip
    got = toml_of(plan)
    par = got["parallelism"]
    assert par["pipeline_parallel_degree"] == 2 and par["tensor_parallel_degree"] == 2
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_microbatch_size"] == 8 // 4
    assert par["module_fqns_per_model_part"] == [
        ["embed", "layers.0"],
        ["layers.1", "final_norm", "lm_head"],
    ]
    assert got["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    gpipe = toml_of(tiny_plan("pp=2", [], pipeline={"schedule": "gpipe", "microbatches": 2}))
    assert gpipe["parallelism"]["pipeline_parallel_schedule"] == "GPipe"
    assert gpipe["parallelism"]["pipeline_parallel_microbatch_size"] == 4


def test_zero2_says_it_has_no_exact_form() -> None:
    text = render_torchtitan_toml(tiny_plan("dp=2", ["dp", "zero2"]))
    assert "# zero2 on mesh axis 'dp' has no exact DTensor form" in text
    assert tomllib.loads(text)["parallelism"]["data_parallel_replicate_degree"] == 2


def test_json_has_every_parameter_in_both_layouts() -> None:
    plan = tiny_plan("dp=2,tp=2", ["fsdp", "megatron_tp"])
    data = parameter_placements(plan)
    params = {p["name"]: p for p in data["parameters"]}
    assert set(params) == {v.name for v in plan.model.values_of_kind(ValueKind.PARAM)}
    assert data["mesh"] == {"shape": [2, 2], "axes": ["dp", "tp"], "ranks": [0, 1, 2, 3]}
    for name, p in params.items():
        spec = plan.completed.specs[name]
        assert "".join(p["shardlab_placements"].values()) == str(spec)
    up = params["layers.1.mlp.up_proj.weight"]
    assert up["shardlab_shape"] == [64, 128] and up["shape"] == [128, 64]
    assert up["shardlab_placements"] == {"dp": "S(0)", "tp": "S(1)"}
    assert up["placements"] == {"dp": "S(1)", "tp": "S(0)"}
    assert up["module"] == "layers.1.mlp.up_proj" and up["kind"] == "linear"
    embed = params["embed.weight"]
    assert embed["transposed"] is False and embed["placements"] == embed["shardlab_placements"]


def test_placements_view_keeps_its_shape() -> None:
    plan = tiny_plan("tp=2", ["megatron_tp"])
    view = placements_view(plan)
    assert view["mesh"] == "tp=2"
    entry = view["values"]["layers.0.attn.q_proj.weight"]
    assert set(entry) == {"spec", "decisions", "next", "reshards"}
    assert entry["spec"] == "S(1)" and entry["decisions"][0]["source"] == "annotation"
    assert "megatron_tp" in entry["decisions"][0]["detail"]


def test_cli_writes_each_format_and_names_bad_input(tmp_path: Path) -> None:
    plan_file = save_plan(tiny_plan("dp=2", ["dp", "zero1"]), tmp_path / "plan.json")
    out = tmp_path / "parallelize.py"
    done = runner.invoke(app, ["export-plan", str(plan_file), "--format", "dtensor", "-o",
                               str(out)])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "note: zero1 on mesh axis 'dp' has no exact DTensor form" in done.output
    assert "replicate(model, mesh=mesh[DATA_AXES[0]], mp_policy=mp)" in out.read_text()
    compile(out.read_text(), str(out), "exec")
    shown = runner.invoke(app, ["export-plan", str(plan_file), "--format", "json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert data["parameters"][0] == {**data["parameters"][0], "name": "embed.weight",
                                     "placements": {"dp": "R"}}  # fmt: skip
    toml = runner.invoke(app, ["export-plan", str(plan_file), "--format", "torchtitan-toml"])
    assert "data_parallel_replicate_degree = 2" in toml.stdout
    args = runner.invoke(app, ["export-plan", str(plan_file), "--format", "torchtitan"])
    assert args.exit_code == 0, args.output
    assert "--parallelism.data_parallel_shard_degree 2" in args.stdout  # zero1 -> FSDP
    assert "note: zero1 on mesh axis 'dp' is run as torchtitan's FSDP" in args.output
    bad = runner.invoke(app, ["export-plan", str(plan_file), "--format", "onnx"])
    assert bad.exit_code == 1 and "unknown export format 'onnx'" in bad.output
    missing = runner.invoke(app, ["export-plan", str(tmp_path / "nope.json")])
    assert missing.exit_code == 1 and "nope.json" in missing.output
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"format": "shardlab.plan/1", "model": {}}))
    answer = runner.invoke(app, ["export-plan", str(broken)])
    assert answer.exit_code == 1 and "missing field 'strategy'" in answer.output
