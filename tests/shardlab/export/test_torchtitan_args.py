"""`--format torchtitan` parsed by torchtitan 0.3's own `ConfigManager` (in process, CPU).

Every export of the export tests' plans (tp, tp+sp, fsdp, dp x tp, fsdp x tp, hsdp,
pipelined, recompute full and selective, ZeRO, gradient accumulation) is handed to
`torchtitan.config.ConfigManager.parse_args` as the argument list the file holds; the job
config it builds must hold the plan's degrees, batch sizes, sequence length, schedule,
micro-batch size, model parts and activation checkpointing. torchtitan is in the `dev`
extra: these tests run in `make test` (a missing torchtitan fails the import, it is never
skipped). The config table (`LLAMA3_CONFIGS`) is read off torchtitan's own llama3 models.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from shardlab.export.parameters import ExportError
from shardlab.export.plan_export import export_plan
from shardlab.export.torchtitan import LLAMA3_CONFIGS, torchtitan_run
from shardlab.models import build_model
from shardlab.plan import Plan, build_plan
from shardlab.strategy import Strategy
from tests.shardlab.export.test_dtensor_export import TINY, gpt2_plan, hf_plan, tiny_plan

torchtitan_config = pytest.importorskip("torchtitan.config", reason="dev extra: torchtitan")
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: E402

INTERLEAVED = {"schedule": "interleaved", "microbatches": 4, "virtual_stages": 1}
#: name -> (mesh, templates, options, expected job config fields)
CASES: dict[str, tuple[str, list[str], dict[str, Any], dict[str, Any]]] = {
    "tp": ("tp=2", ["megatron_tp"], {}, {"tp": 2, "sp": False, "local": 8}),
    "tp_sp": ("tp=2", ["megatron_tp", "sequence_parallel"], {}, {"tp": 2, "sp": True}),
    "fsdp": ("dp=2", ["fsdp"], {}, {"shard": 2, "local": 4}),
    "dp_tp": ("dp=2,tp=2", ["dp", "megatron_tp"], {}, {"replicate": 2, "tp": 2, "sp": False,
                                                         "local": 4}),
    "fsdp_tp": ("dp=2,tp=2", ["fsdp", "megatron_tp", "sequence_parallel"], {},
                {"shard": 2, "tp": 2, "sp": True, "local": 4}),
    "hsdp": ("dpr=2,dps=2", ["dp:dpr", "fsdp:dps"], {"recompute": "full"},
             {"replicate": 2, "shard": 2, "local": 2, "ac": FullAC.Config}),
    "pipelined": ("pp=2,tp=2", ["megatron_tp"], {"recompute": "selective",
                                                 "pipeline": INTERLEAVED},
                  {"pp": 2, "tp": 2, "sp": False, "schedule": "Interleaved1F1B", "micro": 2,
                   "ac": SelectiveAC.Config,
                   "parts": [["tok_embeddings", "layers.0"], ["layers.1", "norm", "lm_head"]]}),
    "gpipe": ("pp=2", [], {"pipeline": {"schedule": "gpipe", "microbatches": 2}},
              {"pp": 2, "schedule": "GPipe", "micro": 4}),
    "full": ("dp=2", ["fsdp"], {"recompute": "full"}, {"shard": 2, "local": 4,
                                                       "ac": FullAC.Config}),
    "selective": ("tp=2", ["megatron_tp"], {"recompute": "selective"},
                  {"tp": 2, "sp": False, "ac": SelectiveAC.Config}),
    "zero2": ("dp=2", ["dp", "zero2"], {}, {"shard": 2, "reshard": "never", "local": 4}),
    "accumulate": ("dp=2", ["fsdp"], {"microbatches": 2},
                   {"shard": 2, "local": 2, "global": 8}),
}  # fmt: skip


@pytest.fixture(scope="module")
def manager() -> Any:
    return torchtitan_config.ConfigManager()


def parse(manager: Any, plan: Plan) -> Any:
    """The job config torchtitan builds from the export's file, as a shell would split it."""
    text = export_plan(plan, "torchtitan").text
    argv = [w for line in text.splitlines() if not line.startswith("#")
            for w in shlex.split(line)]  # fmt: skip
    assert argv == torchtitan_run(plan).argv()
    return manager.parse_args(argv)


@pytest.mark.parametrize("name", list(CASES))
def test_torchtitan_parses_the_plan(manager: Any, name: str) -> None:
    mesh, templates, options, want = CASES[name]
    got = parse(manager, tiny_plan(mesh, templates, **options))
    par, training = got.parallelism, got.training
    assert par.data_parallel_replicate_degree == want.get("replicate", 1)
    assert par.data_parallel_shard_degree == want.get("shard", 1)
    assert par.tensor_parallel_degree == want.get("tp", 1)
    assert par.enable_sequence_parallel is want.get("sp", True)
    assert par.pipeline_parallel_degree == want.get("pp", 1)
    assert par.context_parallel_degree == 1
    assert par.fsdp_reshard_after_forward == want.get("reshard", "default")
    assert training.local_batch_size == want.get("local", 8)
    assert training.global_batch_size == want.get("global", 8)
    assert training.seq_len == 16
    assert training.mixed_precision_param == "bfloat16"
    assert isinstance(got.activation_checkpoint, want.get("ac", type(None)))
    if "schedule" in want:
        assert par.pipeline_parallel_schedule == want["schedule"]
        assert par.pipeline_parallel_microbatch_size == want["micro"]
    if "parts" in want:
        assert par.module_fqns_per_model_part == want["parts"]
    assert got.model_spec.name == "llama3"


def test_gpipe_parts_and_the_8b_config(manager: Any) -> None:
    got = parse(manager, tiny_plan("pp=2", [], pipeline={"schedule": "gpipe", "microbatches": 2}))
    parts = [["tok_embeddings", "layers.0"], ["layers.1", "norm", "lm_head"]]
    assert got.parallelism.module_fqns_per_model_part == parts
    full = build_plan(build_model("llama3-8b", {"seq": 512, "batch": 16}),
                      Strategy.build("dp=2,tp=4", ["fsdp", "megatron_tp", "sequence_parallel"]),
                      passes=False)  # fmt: skip
    run = torchtitan_run(full)
    assert run.options()["--config"] == ["llama3_8b"]
    assert not any("config function" in n for n in run.notes)
    parsed = manager.parse_args(run.argv())
    assert parsed.training.seq_len == 512 and parsed.training.local_batch_size == 8
    assert parsed.parallelism.tensor_parallel_degree == 4


def test_llama3_configs_are_torchtitans_shapes() -> None:
    from torchtitan.models.llama3 import model_registry

    flavors = {"llama3_8b": "8B", "llama3_70b": "70B", "llama3_405b": "405B"}
    for config, flavor in flavors.items():
        m = model_registry(flavor).model
        layer = m.layers[0]
        shape = (len(m.layers), m.dim, layer.attention.n_heads, layer.attention.n_kv_heads,
                 layer.feed_forward.w1.out_features, m.vocab_size)  # fmt: skip
        assert LLAMA3_CONFIGS[config] == shape, config


def test_mapped_plans_say_so() -> None:
    ddp = torchtitan_run(tiny_plan("dp=2,tp=2", ["dp", "megatron_tp"]))
    assert any("no DDP wrapper" in n for n in ddp.notes)
    zero = torchtitan_run(tiny_plan("dp=2", ["dp", "zero1"]))
    assert any("zero1 on mesh axis 'dp' is run as torchtitan's FSDP" in n for n in zero.notes)
    assert not any("no exact DTensor form" in n for n in zero.notes)
    tiny = torchtitan_run(tiny_plan("tp=2", ["megatron_tp"]))
    assert tiny.options()["--config"] == ["llama3_debugmodel"]
    assert any("register a config function" in n for n in tiny.notes)
    text = export_plan(tiny_plan("tp=2", ["megatron_tp"]), "torchtitan")
    assert text.filename.endswith("_torchtitan.args") and text.notes == tuple(tiny.notes)
    assert "# note: torchtitan 0.3 takes the model's shape" in text.text


def test_models_torchtitan_has_no_module_for_are_refused() -> None:
    gpt2 = build_model("gpt2", {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq": 16})
    with pytest.raises(ExportError, match=r"is a gpt2 model: torchtitan 0\.3 has a module for"):
        torchtitan_run(build_plan(gpt2, Strategy.build("tp=2", ["megatron_tp"]), passes=False))
    with pytest.raises(ExportError, match=r"was imported \(torch\.export\)"):
        torchtitan_run(hf_plan("tp=2", ["megatron_tp"]))
    with pytest.raises(ExportError, match="was imported"):
        torchtitan_run(gpt2_plan([], []))
    with pytest.raises(ExportError, match="'dp', 'r' both shard the training state"):
        torchtitan_run(tiny_plan("dp=2,r=2", ["dp", "zero1", "fsdp:r"]))


def test_the_toml_of_older_torchtitan_is_still_there() -> None:
    import tomllib

    got = tomllib.loads(export_plan(tiny_plan("dp=2", ["fsdp"]), "torchtitan-toml").text)
    assert got["parallelism"]["data_parallel_shard_degree"] == 2


assert TINY["layers"] == 2  # the parts above name layers 0 and 1
