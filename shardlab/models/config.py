"""Model configurations and `--set key=value` overrides.

A preset is a config dataclass plus a builder. Overrides are applied by field name with type
coercion; an unknown key, a value of the wrong type or a size that is not positive or over
`shardlab.ir.MAX_DIM` raises `PresetError` that names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shardlab.errors import PresetError
from shardlab.ir import DTYPE_BYTES, FLOAT_DTYPES, MAX_DIM

#: Attention implementations: a fused kernel, or eager ops that keep the probabilities.
ATTENTION = ("flash", "eager")
#: Settings whose value is one of a few names.
CHOICES: dict[str, tuple[str, ...]] = {"attention": ATTENTION}
_BOOLS = {"true": True, "1": True, "false": False, "0": False}
#: Families whose ffn is 4 * hidden unless set: `--set hidden=...` alone keeps the ratio.
FFN_FOLLOWS_HIDDEN = ("gpt",)


@dataclass(frozen=True, slots=True)
class TransformerConfig:
    """A decoder-only transformer (GPT-2, Megatron-LM GPT or Llama family).

    `dropout`: probability of the hidden (and, with eager attention, attention-probability)
    dropouts, 0 for none; `attention`: "flash" (one fused op) or "eager" (matmuls, a masked
    softmax and dropout whose outputs are kept for backward); `tie_embeddings`: lm_head
    reuses `embed.weight`; `pad_vocab`: the embedding table and lm_head get
    `padded_vocab` rows, `vocab` rounded up to a multiple of it (Megatron-LM's
    `make_vocab_size_divisible_by` times the tensor-parallel size, e.g. 128 x 4 = 512 makes
    50257 into 50688), 1 for none. Uneven vocab shards need no padding; this mirrors the
    recipe (real data never holds ids past `vocab`: the padded rows only join the softmax).
    """

    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    batch: int
    dtype: str = "bfloat16"
    max_positions: int = 0
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    dropout: float = 0.0
    attention: str = "flash"
    tie_embeddings: bool = False
    pad_vocab: int = 1

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def padded_vocab(self) -> int:
        """`vocab` rounded up to a multiple of `pad_vocab` (the table's rows)."""
        return -(-self.vocab // self.pad_vocab) * self.pad_vocab

    def check(self) -> None:
        """Raise PresetError for a combination that cannot form a model."""
        _check_common(self)
        if self.hidden % self.heads:
            raise PresetError(
                f"hidden ({self.hidden}) must be divisible by heads ({self.heads})", key="hidden"
            )
        if self.heads % self.kv_heads:
            raise PresetError(
                f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})",
                key="kv_heads",
            )
        if self.family == "llama" and self.head_dim % 2:
            raise PresetError(f"rotary embedding needs an even head dim, got {self.head_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise PresetError(f"dropout must be in [0, 1), got {self.dropout}", key="dropout")
        if self.attention not in ATTENTION:
            raise PresetError(
                f"attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}",
                key="attention",
            )
        if self.family == "gpt2" and self.seq > self.max_positions:
            raise PresetError(
                f"seq ({self.seq}) exceeds the {self.max_positions} learned positions of gpt2",
                key="seq",
            )


@dataclass(frozen=True, slots=True)
class MlpDemoConfig:
    """The two-matmul demo net: x[batch, hidden] @ w0[hidden, hidden] @ w1[hidden, classes]."""

    batch: int = 16
    hidden: int = 32
    classes: int = 8
    dtype: str = "float32"

    def check(self) -> None:
        _check_common(self)


ModelConfig = TransformerConfig | MlpDemoConfig

#: Fields a user may override with --set; the rest define the family.
OVERRIDABLE = (
    "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "batch", "dtype", "classes",
    "dropout", "attention", "tie_embeddings", "pad_vocab",
)  # fmt: skip


def _check_common(config: ModelConfig) -> None:
    for f in dataclasses.fields(config):
        val = getattr(config, f.name)
        if f.name == "dtype":
            if val not in FLOAT_DTYPES:
                raise PresetError(
                    f"dtype must be one of {', '.join(sorted(FLOAT_DTYPES))}, got {val!r}",
                    key="dtype",
                )
        elif isinstance(val, int) and not isinstance(val, bool):
            _check_size(f.name, val)


def _check_size(name: str, val: int) -> None:
    """A size setting (layers, hidden, heads, seq, ...) is positive and at most `MAX_DIM`:
    each becomes a dim of some value (`shardlab.ir`), so a larger one could never build."""
    if name != "max_positions" and val <= 0:
        raise PresetError(f"{name} must be positive, got {val}", key=name)
    if val > MAX_DIM:
        raise PresetError(
            f"{name} must be at most {MAX_DIM} (2^31 - 1), got {val}",
            key=name,
            value=val,
            limit=MAX_DIM,
        )


def parse_overrides(pairs: Iterable[str]) -> dict[str, str]:
    """Turn `["layers=2", "seq=128"]` into a dict; malformed pairs are named."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, val = pair.partition("=")
        if not sep or not key.strip() or not val.strip():
            raise PresetError(f"override {pair!r} is not of the form key=value", override=pair)
        out[key.strip()] = val.strip()
    return out


def apply_overrides(config: ModelConfig, overrides: Mapping[str, Any], preset: str) -> ModelConfig:
    """A copy of `config` with `overrides` applied and checked."""
    fields = {f.name: f for f in dataclasses.fields(config)}
    allowed = [k for k in OVERRIDABLE if k in fields]
    changes: dict[str, Any] = {}
    for key, raw in overrides.items():
        if key not in allowed:
            raise PresetError(
                f"{preset} has no setting {key!r}; settable: {', '.join(allowed)}", key=key
            )
        changes[key] = _coerce(key, raw, type(getattr(config, key)))
    keeps_mha = isinstance(config, TransformerConfig) and config.kv_heads == config.heads
    if keeps_mha and "heads" in changes and "kv_heads" not in changes:
        changes["kv_heads"] = changes["heads"]
    follows = isinstance(config, TransformerConfig) and config.family in FFN_FOLLOWS_HIDDEN
    if follows and "hidden" in changes and "ffn" not in changes:
        changes["ffn"] = 4 * changes["hidden"]
    new = dataclasses.replace(config, **changes)
    new.check()
    return new


def _coerce(key: str, raw: Any, typ: type) -> Any:
    if typ is bool:
        word = str(raw).strip().lower()
        if not isinstance(raw, bool) and word not in _BOOLS:
            raise PresetError(f"{key} must be true or false (or 1 / 0), got {raw!r}", key=key)
        return raw if isinstance(raw, bool) else _BOOLS[word]
    if key in CHOICES:
        if raw not in CHOICES[key]:
            raise PresetError(
                f"{key} must be one of {', '.join(CHOICES[key])}, got {raw!r}", key=key
            )
        return str(raw)
    if isinstance(raw, bool) and typ is not str:
        raise PresetError(f"{key} must be {_what(typ)}, got {raw!r}", key=key)
    if isinstance(raw, typ):
        return raw
    if typ is str:
        if raw not in DTYPE_BYTES:
            raise PresetError(f"{key} must be a dtype name, got {raw!r}", key=key)
        return str(raw)
    try:
        if typ is int:
            return int(str(raw).replace("_", ""), 10)
        return typ(raw)
    except (TypeError, ValueError):
        raise PresetError(f"{key} must be {_what(typ)}, got {raw!r}", key=key) from None


def _what(typ: type) -> str:
    return {int: "an integer", float: "a number"}.get(typ, typ.__name__)
