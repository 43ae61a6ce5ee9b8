"""Model configurations and `--set key=value` overrides.

A preset is a config dataclass plus a builder. Overrides are applied by field name with type
coercion; an unknown key or a value of the wrong type raises `PresetError` that names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shardlab.errors import PresetError
from shardlab.ir import DTYPE_BYTES, FLOAT_DTYPES


@dataclass(frozen=True, slots=True)
class TransformerConfig:
    """A decoder-only transformer (GPT-2 or Llama family)."""

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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

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
        elif isinstance(val, int) and f.name != "max_positions" and val <= 0:
            raise PresetError(f"{f.name} must be positive, got {val}", key=f.name)


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
    new = dataclasses.replace(config, **changes)
    new.check()
    return new


def _coerce(key: str, raw: Any, typ: type) -> Any:
    if isinstance(raw, typ) and not (typ is int and isinstance(raw, bool)):
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
        raise PresetError(
            f"{key} must be {'an integer' if typ is int else typ.__name__}, got {raw!r}", key=key
        ) from None
