"""Import a Hugging Face causal language model from its `config.json` (no weights).

`graph_from_hf_config(config, batch=1, seq=None)` builds the model with
`transformers.AutoModelForCausalLM.from_config` on the meta device (no memory), exports its
forward on `input_ids` [batch, seq] and imports it (`torch_export.graph_from_module`):
parameters keep their Hugging Face names and layouts (`model.layers.0.self_attn.q_proj.weight`,
[out, in]), and `Graph.num_params()` equals the model's `num_parameters()`.

The loss is the presets' next-token cross entropy: an op `loss` (scope `loss`) of the logits
against an input `labels` [batch, seq] holding each position's next token. It is added
after the export rather than exported with `labels=`: Hugging Face's loss shifts the labels
inside the model (padding with -100 and ignoring those positions), which the catalog's
`cross_entropy` does not express; the loss it adds is the same function of logits and
shifted labels over all positions.

`seq` defaults to `min(max positions, DEFAULT_SEQ)`; both must fit the model's position
limit. Architectures tested: llama, mistral, qwen2, gpt2, gemma (`SUPPORTED`); another
`model_type` is refused naming the field (`model_type`, or `architectures` when the type is
derived from it). The model is built in training mode, so dropouts of the config are ops of
the graph; attention dropout is not modelled (the fused attention op has none: the import's
`meta["import_notes"]` says so).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shardlab.errors import ModelImportError
from shardlab.ir import Graph, Op, OpRole, TensorType, Value, ValueKind

SUPPORTED = ("llama", "mistral", "qwen2", "gpt2", "gemma")
#: The sequence length when none is given and the model allows at least this many positions.
DEFAULT_SEQ = 2048
_POSITION_FIELDS = ("max_position_embeddings", "n_positions")
#: the config fields that size the model: each, when given (and not null), a positive int
SIZE_FIELDS = (
    "num_hidden_layers", "n_layer", "hidden_size", "n_embd", "num_attention_heads", "n_head",
    "num_key_value_heads", "intermediate_size", "n_inner", "vocab_size", "head_dim",
    *_POSITION_FIELDS,
)  # fmt: skip


def graph_from_hf_config(
    config: Mapping[str, Any],
    *,
    batch: int = 1,
    seq: int | None = None,
    name: str | None = None,
) -> Graph:
    """The training forward graph (tokens, labels -> loss) of the model `config` describes."""
    if not isinstance(config, Mapping):
        raise ModelImportError(
            f"a Hugging Face config must be a JSON object, got {type(config).__name__}"
        )
    model_type = _model_type(config)
    check_sizes(config)
    limit = _positions(config)
    batch = _positive(batch, "batch")
    seq = _positive(seq, "seq") if seq is not None else min(limit or DEFAULT_SEQ, DEFAULT_SEQ)
    if limit is not None and seq > limit:
        raise ModelImportError(
            f"seq {seq} is longer than the model's {limit} positions "
            f"({next(f for f in _POSITION_FIELDS if f in config)})",
            field="seq",
        )
    model = _build(model_type, config)
    import torch

    from shardlab.importers.torch_export import graph_from_module

    ids = torch.zeros((batch, seq), dtype=torch.long, device="meta")
    hf = model.config
    heads = getattr(hf, "num_attention_heads", None) or getattr(hf, "n_head", None)
    kv_heads = getattr(hf, "num_key_value_heads", None) or heads
    meta = {
        # the whole config, so a pipeline can rebuild the model for one micro-batch
        "hf_config": {
            "model_type": model_type,
            "batch": batch,
            "seq": seq,
            "config": json.loads(json.dumps(dict(config))),
        },
        "attention_heads": heads,
        "kv_heads": kv_heads,
    }
    graph = graph_from_module(
        model, (), name=name or f"hf-{model_type}", example_kwargs={"input_ids": ids},
        constants=_buffer_values(model), meta=meta,
    )  # fmt: skip
    return _with_loss(graph, batch, seq)


def check_sizes(config: Mapping[str, Any]) -> None:
    """Refuse a size field (`SIZE_FIELDS`) that is not a positive integer, naming it: zero
    heads would divide by zero in transformers, -1 layers build an empty model. Cheap, no
    torch: the service checks it before it queues an import."""
    for field in SIZE_FIELDS:
        value = config.get(field)
        if value is not None:
            _positive(value, field)


def _model_type(config: Mapping[str, Any]) -> str:
    model_type = config.get("model_type")
    if model_type is None:
        archs = config.get("architectures")
        if not isinstance(archs, list) or not archs:
            raise ModelImportError(
                "the config has no 'model_type' (nor 'architectures' to derive it from); "
                f"supported: {', '.join(SUPPORTED)}",
                field="model_type",
            )
        for arch in archs:
            for known in SUPPORTED:
                if str(arch).lower().startswith(known.replace("_", "")):
                    return known
        raise ModelImportError(
            f"unsupported architecture in field 'architectures': {archs}; supported model "
            f"types: {', '.join(SUPPORTED)}",
            field="architectures",
        )
    if model_type not in SUPPORTED:
        raise ModelImportError(
            f"unsupported model_type {model_type!r} in field 'model_type'; supported: "
            f"{', '.join(SUPPORTED)}",
            field="model_type",
        )
    archs = config.get("architectures")
    if archs is not None and not any(str(a).endswith("ForCausalLM") or
                                     str(a).endswith("LMHeadModel") for a in archs):  # fmt: skip
        raise ModelImportError(
            f"field 'architectures' names {archs}, none of them a causal language model "
            "(...ForCausalLM or ...LMHeadModel)",
            field="architectures",
        )
    return str(model_type)


def _positions(config: Mapping[str, Any]) -> int | None:
    for field in _POSITION_FIELDS:
        if field in config:
            return _positive(config[field], field)
    return None


def _positive(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelImportError(f"{field} must be a positive integer, got {value!r}", field=field)
    return value


def _build(model_type: str, config: Mapping[str, Any]) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    fields["use_cache"] = False
    try:
        hf_config = AutoConfig.for_model(model_type, **fields)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
                hf_config, attn_implementation="sdpa"
            )
    except (ValueError, TypeError, KeyError, AttributeError, RuntimeError) as exc:
        raise ModelImportError(
            f"transformers cannot build a {model_type} model from this config: {exc}",
            field=_field_named(str(exc), config),
        ) from exc
    model.train()
    return model


def _field_named(message: str, config: Mapping[str, Any]) -> str | None:
    """The config field an error message mentions, if any."""
    return next((k for k in config if f"{k}" in message), None)


def _buffer_values(model: Any) -> dict[str, Any]:
    """CPU values of the buffers a meta-device model computes in `__init__` from its config
    (rotary `inv_freq`): each parameterless module holding meta buffers is built again on
    the CPU from its `config`, which is cheap (no parameters)."""
    import torch

    out: dict[str, Any] = {}
    for path, module in model.named_modules():
        buffers = dict(module.named_buffers(recurse=False))
        if not buffers or not any(b.is_meta for b in buffers.values()):
            continue
        if any(True for _ in module.parameters(recurse=False)) or not hasattr(module, "config"):
            continue
        try:
            with torch.device("cpu"):
                twin = type(module)(module.config)
        except Exception:  # a module not built from its config alone: its buffers stay values
            continue
        for key, value in twin.named_buffers(recurse=False):
            out[f"{path}.{key}" if path else key] = value
    return out


def _with_loss(graph: Graph, batch: int, seq: int) -> Graph:
    """`graph` (tokens -> logits) with the next-token cross entropy of the presets."""
    (logits,) = graph.outputs
    ltype = graph.type_of(logits)
    if ltype.shape[:2] != (batch, seq) or ltype.rank != 3:
        raise ModelImportError(
            f"the model's output {logits!r} has shape {list(ltype.shape)}, not the "
            f"[batch, seq, vocab] logits of a causal language model",
            value=logits,
        )
    labels = Value("labels", TensorType((batch, seq), "int64"), ValueKind.INPUT)
    loss = Value("loss", TensorType((), ltype.dtype), ValueKind.ACTIVATION)
    op = Op("loss", "cross_entropy", (logits, "labels"), ("loss",), {}, "loss", OpRole.LOSS)
    values = [*graph.values.values(), labels, loss]
    return Graph(values, [*graph.ops, op], name=graph.name, outputs=["loss"], meta=graph.meta)
