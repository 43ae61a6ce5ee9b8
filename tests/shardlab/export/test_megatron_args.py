"""`--format megatron`: Megatron-LM's `pretrain_gpt.py` options, checked with megatron-core.

PyPI's `megatron-core` (the `dev` extra) holds `megatron.core` only, not Megatron-LM's
`megatron.training.arguments` parser. Megatron-LM builds most of its model and parallelism
options from megatron.core's `TransformerConfig` dataclass (`ArgumentGroupFactory`: field
`tensor_model_parallel_size` is `--tensor-model-parallel-size`), and builds the
`TransformerConfig` back from the parsed options (`core_transformer_config_from_args`: every
field the options name, `--swiglu` as a gated SiLU, `--group-query-attention` keeps
`--num-query-groups`, `--bf16` the parameters' dtype). The test does the same with the
installed megatron-core: every option the export writes must be a `TransformerConfig` field
or one of the Megatron-LM options below (`TRAINING_OPTIONS`, checked by hand against
Megatron-LM's arguments.py and its TrainingConfig), and the `TransformerConfig` they make
must construct (its own checks: heads over tensor-parallel ranks, recomputation, virtual
pipeline stages) and hold the plan's values; `--use-distributed-optimizer` builds
megatron.core's `DistributedDataParallelConfig`.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from typing import Any

import pytest

from shardlab.export.megatron import megatron_run
from shardlab.export.parameters import ExportError
from shardlab.export.plan_export import export_plan
from shardlab.plan import Plan
from tests.shardlab.export.test_dtensor_export import hf_plan, tiny_plan

pytest.importorskip("megatron.core", reason="dev extra: megatron-core")
torch = pytest.importorskip("torch")

#: Megatron-LM options that are not TransformerConfig fields: name -> argparse keywords
TRAINING_OPTIONS: dict[str, dict[str, Any]] = {
    "--micro-batch-size": {"type": int},
    "--global-batch-size": {"type": int},
    "--seq-length": {"type": int},
    "--max-position-embeddings": {"type": int},
    "--vocab-size": {"type": int},
    "--use-distributed-optimizer": {"action": "store_true"},
    "--num-layers-per-virtual-pipeline-stage": {"type": int},
    "--decoder-first-pipeline-num-layers": {"type": int},
    "--decoder-last-pipeline-num-layers": {"type": int},
    "--swiglu": {"action": "store_true"},
    "--group-query-attention": {"action": "store_true"},
    "--position-embedding-type": {"choices": ["learned_absolute", "rope"]},
    "--rotary-base": {"type": int},
    "--untie-embeddings-and-output-weights": {"action": "store_true"},
    "--optimizer": {"choices": ["adam", "sgd"]},
    "--lr": {"type": float},
}


def megatron_parser() -> argparse.ArgumentParser:
    """Options named as Megatron-LM names them: TransformerConfig's fields (installed
    megatron-core) and `TRAINING_OPTIONS`; an unknown option is an error."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    parser = argparse.ArgumentParser(exit_on_error=False)
    for name, kwargs in TRAINING_OPTIONS.items():
        parser.add_argument(name, **kwargs)
    for f in dataclasses.fields(TransformerConfig):
        flag = "--" + f.name.replace("_", "-")
        if flag in TRAINING_OPTIONS:
            continue
        if f.type in (bool, "bool"):
            parser.add_argument(flag, action="store_true", default=None)
        else:
            parser.add_argument(flag, default=None)
    return parser


def _typed(value: Any) -> Any:
    """An option's text as the number it spells (argparse's `type=` of the field)."""
    if not isinstance(value, str):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except (TypeError, ValueError):
            pass
    return value


def transformer_config(plan: Plan) -> tuple[Any, argparse.Namespace]:
    """The TransformerConfig the export's options make, as Megatron-LM makes it."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    text = export_plan(plan, "megatron").text
    argv = [w for line in text.splitlines() if not line.startswith("#")
            for w in shlex.split(line)]  # fmt: skip
    assert argv == megatron_run(plan).argv()
    args = megatron_parser().parse_args(argv)
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    kw = {name: _typed(value) for name, value in vars(args).items()
          if name in fields and value is not None}  # fmt: skip
    if args.swiglu:
        kw["gated_linear_unit"] = True
        kw["activation_func"] = torch.nn.functional.silu
    kw["num_query_groups"] = int(args.num_query_groups) if args.group_query_attention else None
    if args.bf16:
        kw["params_dtype"] = kw["pipeline_dtype"] = torch.bfloat16
    if args.num_layers_per_virtual_pipeline_stage:
        per_rank = kw["num_layers"] // kw["pipeline_model_parallel_size"]
        kw["virtual_pipeline_model_parallel_size"] = (
            per_rank // args.num_layers_per_virtual_pipeline_stage
        )
    return TransformerConfig(**kw), args


def test_tensor_sequence_parallel_and_model_shape() -> None:
    config, args = transformer_config(tiny_plan("tp=2", ["megatron_tp", "sequence_parallel"]))
    assert config.tensor_model_parallel_size == 2 and config.sequence_parallel is True
    assert config.pipeline_model_parallel_size == 1 and config.context_parallel_size == 1
    assert (config.num_layers, config.hidden_size, config.ffn_hidden_size) == (2, 64, 128)
    assert (config.num_attention_heads, config.num_query_groups) == (4, 2)
    assert config.gated_linear_unit and config.normalization == "RMSNorm"
    assert config.bf16 and config.params_dtype == torch.bfloat16
    assert (args.micro_batch_size, args.global_batch_size, args.seq_length) == (8, 8, 16)
    assert args.vocab_size == 256 and args.position_embedding_type == "rope"
    assert args.untie_embeddings_and_output_weights and not args.use_distributed_optimizer


def test_data_parallel_zero1_and_recompute_full() -> None:
    from megatron.core.distributed import DistributedDataParallelConfig

    config, args = transformer_config(
        tiny_plan("dp=2,tp=2", ["dp", "zero1", "megatron_tp"], recompute="full")
    )
    assert config.tensor_model_parallel_size == 2 and not config.sequence_parallel
    assert (config.recompute_granularity, config.recompute_method) == ("full", "uniform")
    assert config.recompute_num_layers == 1
    assert args.use_distributed_optimizer and args.micro_batch_size == 4
    ddp = DistributedDataParallelConfig(use_distributed_optimizer=args.use_distributed_optimizer)
    assert ddp.use_distributed_optimizer


def test_interleaved_pipeline_and_selective_recompute() -> None:
    plan = tiny_plan(
        "pp=2,tp=2", ["megatron_tp"], recompute="selective",
        pipeline={"schedule": "interleaved", "microbatches": 4, "virtual_stages": 1},
    )  # fmt: skip
    config, args = transformer_config(plan)
    assert config.pipeline_model_parallel_size == 2 and config.tensor_model_parallel_size == 2
    assert config.recompute_granularity == "selective" and config.recompute_method is None
    assert (args.micro_batch_size, args.global_batch_size) == (2, 8)  # 4 micro-batches


def test_accumulation_on_a_flat_mesh() -> None:
    _, args = transformer_config(tiny_plan("dp=2", ["dp"], microbatches=2))
    assert (args.micro_batch_size, args.global_batch_size) == (2, 8)  # 2 x 2 ranks x 2 steps


def test_what_megatron_cannot_say_is_refused() -> None:
    with pytest.raises(ExportError, match=r"mesh axis 'dp' is FSDP .* Megatron-LM's pretrain_gpt"):
        megatron_run(tiny_plan("dp=2", ["fsdp"]))
    with pytest.raises(ExportError, match=r"'layers\.0\.attn\.q_proj\.weight' is replicated on "
                       "tensor-parallel mesh axis 'tp'"):  # fmt: skip
        megatron_run(
            tiny_plan(
                "tp=2",
                ["megatron_tp"],
                ["layers.0.attn.q_proj.weight=tp:R", "layers.0.attn.o_proj.weight=tp:R"],
            )
        )
    with pytest.raises(ExportError, match=r"was imported|is imported"):
        megatron_run(hf_plan("tp=2", ["megatron_tp"]))
    notes = megatron_run(tiny_plan("tp=2", ["megatron_tp"])).notes
    assert any("bias" in n for n in notes)
