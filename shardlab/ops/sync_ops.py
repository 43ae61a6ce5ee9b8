"""Kinds that order and release buffers rather than compute: wait, hold, free, send, recv.

Passes insert them into a `DistProgram` (they never appear in a serial graph, so they have
no SPMD rule and no VJP); `shardlab.runtime.hazards` gives them their meaning:

- wait(*values): an explicit synchronisation point on the async ops producing `values` (the
  op's deps name them); does nothing else.
- hold(*values): keeps the buffers of `values` alive up to this point and reads nothing
  (seed 001's no-op: a sent buffer stays alive until a later recv implies the send is done).
- free(*values): releases the buffers of `values`; nothing may use them afterwards.
- send(x): attrs `peer` (a rank, or a map rank -> peer) and `tag` (str); reads x
  asynchronously. recv(): attrs `peer`, `tag`, `shape`, `dtype` -> the received tensor.
  Neither runs on one device (numpy implementation: none yet).

None of them does arithmetic (0 FLOPs) or moves data through memory (0 bytes; the cost model
charges send / recv as communication).

Not yet imported by `shardlab.ops` (so not in the catalog by default): the catalog-wide tests
list the families and kinds they accept, and need this family added first. The simulated
mesh and `check_hazards` do not need the catalog for these kinds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shardlab.errors import OpSignatureError
from shardlab.ir import DTYPE_BYTES, TensorType
from shardlab.ops.base import (
    Array,
    Attrs,
    InferFn,
    NumpyFn,
    OpDef,
    attr_ints,
    attr_str,
    register,
)

FAMILY = "sync_ops"


def _no_bytes(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    return 0


def _no_outputs(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    return []


def _nothing(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    return []


def _check_peer(kind: str, attrs: Attrs) -> None:
    peer = attrs.get("peer")
    ok = isinstance(peer, Mapping) or (isinstance(peer, int) and not isinstance(peer, bool))
    if not ok:
        raise OpSignatureError(
            f"{kind}: attribute 'peer' must be a rank or a map rank -> peer, got {peer!r}",
            attr="peer",
        )
    tag = attrs.get("tag", "")
    if not isinstance(tag, str):
        raise OpSignatureError(f"{kind}: attribute 'tag' must be a string, got {tag!r}")


def _send_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _check_peer("send", attrs)
    return []


def _recv_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _check_peer("recv", attrs)
    shape = attr_ints(attrs, "shape")
    if any(d <= 0 for d in shape):
        raise OpSignatureError(f"recv: attribute 'shape' {shape} must be positive", attr="shape")
    return [TensorType(tuple(shape), attr_str(attrs, "dtype", tuple(DTYPE_BYTES)))]


def _reg(kind: str, doc: str, n_in: int, n_max: int | None, infer: InferFn,
         impl: NumpyFn | None) -> None:  # fmt: skip
    register(OpDef(kind, FAMILY, doc, n_in, n_max, infer, impl, bytes=_no_bytes))


_reg("wait", "synchronises on the async ops producing its inputs (named in deps); no outputs.",
     1, None, _no_outputs, _nothing)  # fmt: skip
_reg("hold", "keeps its inputs' buffers alive up to this point; reads nothing, no outputs.",
     1, None, _no_outputs, _nothing)  # fmt: skip
_reg("free", "releases its inputs' buffers; nothing may use them afterwards; no outputs.",
     1, None, _no_outputs, _nothing)  # fmt: skip
_reg("send", "sends x to attr peer (attr tag), reading x asynchronously; no outputs.",
     1, 1, _send_infer, None)  # fmt: skip
_reg("recv", "the tensor (attrs shape, dtype) sent by attr peer with attr tag.",
     0, 0, _recv_infer, None)  # fmt: skip
