"""The training graph: forward ops, backward ops from each kind's VJP, optimizer ops.

`training_graph(graph, optimizer="adamw", lr=1e-3, **opt)` differentiates the scalar loss
(the output of the op with role `loss`, else the graph's only scalar float output) with
respect to every float param it depends on:

- the seed d(loss) = 1 is a `fill` op writing `<loss>.grad`;
- ops are visited in reverse topological order; each op's VJP (`shardlab.vjp_rules`) emits
  backward ops (role backward, the forward op's scope) for the inputs that need a gradient;
- a value with several gradient contributions gets them summed by `add` ops; the total is
  the value `<value>.grad` (kind grad);
- per param `p` with a gradient, one optimizer op (role optimizer) writes `p.new` (kind
  param) and, for AdamW, `p.exp_avg.new`, `p.exp_avg_sq.new` from the state values
  `p.exp_avg`, `p.exp_avg_sq` (kind state); attr `inplace` maps each output to the input it
  overwrites, so completion keeps params and state where they are.

Integer values never get a gradient; kinds listed in `vjp_rules.NON_DIFFERENTIABLE` are
refused when they lie between a param and the loss.
"""

from __future__ import annotations

from typing import Any

from shardlab import vjp_rules
from shardlab.errors import GraphError
from shardlab.ir import Graph, Op, OpRole, TensorType, Value, ValueKind
from shardlab.ops import (
    autodiff_ops,  # noqa: F401  (registers the backward kinds)
    get_op,
    infer_types,
)

OPTIMIZERS = ("adamw", "sgd")
ADAMW_DEFAULTS: dict[str, Any] = {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
                                  "step": 1}  # fmt: skip
SGD_DEFAULTS: dict[str, Any] = {"weight_decay": 0.0}


class BackwardContext:
    """Emits backward ops for one forward op at a time (the API VJPs are written against)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.values: dict[str, Value] = dict(graph.values)
        self.ops: list[Op] = []
        self.current: Op | None = None
        self._count: dict[str, int] = {}
        self._renames: dict[str, str] = {}

    def type(self, name: str) -> TensorType:
        return self.values[name].type

    def _fresh(self, base: str) -> str:
        n = self._count.get(base, 0)
        while f"{base}{n}" in self.values:
            n += 1
        self._count[base] = n + 1
        return f"{base}{n}"

    def emit(
        self,
        kind: str,
        inputs: list[str],
        attrs: dict[str, Any] | None = None,
        *,
        role: OpRole = OpRole.BACKWARD,
        names: list[str] | None = None,
        kinds: list[ValueKind] | None = None,
        op_name: str | None = None,
    ) -> list[str]:
        """Append an op; outputs are fresh activations unless `names`/`kinds` are given."""
        attrs = dict(attrs or {})
        types = infer_types(kind, [self.type(v) for v in inputs], attrs)
        fwd = self.current
        name = op_name or self._fresh(f"{fwd.name}.bwd" if fwd else f"{kind}.")
        outs = names or ([name] if len(types) == 1 else [f"{name}.{i}" for i in range(len(types))])
        for i, (out, t) in enumerate(zip(outs, types, strict=True)):
            if out in self.values:
                raise GraphError(f"autodiff: value name {out!r} is already taken", value=out)
            self.values[out] = Value(out, t, kinds[i] if kinds else ValueKind.ACTIVATION)
        self.ops.append(Op(name, kind, tuple(inputs), tuple(outs), attrs,
                           fwd.scope if fwd else "", role))  # fmt: skip
        return outs

    def rename(self, old: str, new: str) -> str:
        """Rename the fresh value `old` to `new` (kind grad); `finish` applies it to ops."""
        if new in self.values:
            raise GraphError(f"autodiff: value name {new!r} is already taken", value=new)
        self.values[new] = Value(new, self.values.pop(old).type, ValueKind.GRAD)
        self._renames[old] = new
        return new

    def finish(self) -> list[Op]:
        """The emitted ops with renames applied."""
        m = self._renames
        return [
            op if not (set(op.inputs) | set(op.outputs)) & m.keys()
            else Op(op.name, op.kind, tuple(m.get(v, v) for v in op.inputs),
                    tuple(m.get(v, v) for v in op.outputs), op.attrs, op.scope, op.role)
            for op in self.ops
        ]  # fmt: skip

    def one(self, kind: str, inputs: list[str], attrs: dict[str, Any] | None = None) -> str:
        (out,) = self.emit(kind, inputs, attrs)
        return out

    def zeros(self, like: str) -> str:
        t = self.type(like)
        return self.one("fill", [], {"shape": list(t.shape), "value": 0.0, "dtype": t.dtype})

    def sum_to(self, grad: str, like: str) -> str:
        """`grad` summed over the dims that broadcasting added to `like`'s shape."""
        gs, ts = self.type(grad).shape, self.type(like).shape
        if gs == ts:
            return grad
        lead = len(gs) - len(ts)
        dims = [i for i in range(len(gs)) if i < lead or (ts[i - lead] == 1 and gs[i] != 1)]
        if dims:
            grad = self.one("sum", [grad], {"dims": dims, "keepdim": True})
        return self.one("reshape", [grad], {"shape": list(ts)})


def find_loss(graph: Graph) -> str:
    """The scalar loss value of `graph`."""
    loss_ops = [op for op in graph.ops if op.role == OpRole.LOSS]
    cands = [v for op in loss_ops for v in op.outputs] if loss_ops else list(graph.outputs)
    cands = [v for v in cands if graph.type_of(v).shape == () and graph.type_of(v).is_float]
    if len(cands) != 1:
        raise GraphError(
            f"autodiff: graph {graph.name!r} needs exactly one scalar float loss, found "
            f"{cands or 'none'}"
        )
    return cands[0]


def _needs_grad(graph: Graph, loss: str) -> set[str]:
    """Float values on a path from a float param to the loss."""
    from_param = {
        v.name for v in graph.values.values() if v.kind == ValueKind.PARAM and v.type.is_float
    }
    for op in graph.ops:
        if any(v in from_param for v in op.inputs) and op.kind != "rope_cache":
            from_param |= {v for v in op.outputs if graph.type_of(v).is_float}
    to_loss = {loss}
    for op in reversed(graph.ops):
        if any(v in to_loss for v in op.outputs):
            to_loss |= set(op.inputs)
    return from_param & to_loss


def backward(graph: Graph, loss: str | None = None) -> tuple[BackwardContext, dict[str, str]]:
    """Emit the backward ops of `graph`; returns the context and value -> its grad value."""
    loss = loss or find_loss(graph)
    need = _needs_grad(graph, loss)
    ctx = BackwardContext(graph)
    lt = graph.type_of(loss)
    contribs: dict[str, list[str]] = {loss: ctx.emit(
        "fill", [], {"shape": [], "value": 1.0, "dtype": lt.dtype},
        names=[f"{loss}.grad"], kinds=[ValueKind.GRAD], op_name=f"{loss}.grad_seed")}  # fmt: skip
    grads: dict[str, str] = {}
    claimed: set[str] = set(graph.values)

    def total(v: str) -> str | None:
        parts = contribs.get(v)
        if not parts:
            return None
        if v in grads:
            return grads[v]
        acc = parts[0]
        for i, part in enumerate(parts[1:], start=1):
            last = i == len(parts) - 1
            acc = ctx.emit("add", [acc, part], names=[f"{v}.grad"] if last else None,
                           kinds=[ValueKind.GRAD] if last else None,
                           op_name=f"{v}.grad_acc" if last else None)[0]  # fmt: skip
        if len(parts) == 1 and acc not in claimed and acc != f"{v}.grad":
            acc = ctx.rename(acc, f"{v}.grad")
        elif acc != f"{v}.grad" and graph.value(v).kind == ValueKind.PARAM:
            shape = list(graph.type_of(v).shape)  # an alias: copy it under the grad's name
            acc = ctx.emit("reshape", [acc], {"shape": shape}, names=[f"{v}.grad"],
                           kinds=[ValueKind.GRAD], op_name=f"{v}.grad_copy")[0]  # fmt: skip
        claimed.add(acc)
        grads[v] = acc
        return acc

    for op in reversed(graph.ops):
        if not any(v in need for v in op.outputs):
            continue
        dys = [total(v) for v in op.outputs]
        if all(d is None for d in dys):
            continue
        needs = [v in need for v in op.inputs]
        opdef = get_op(op.kind)
        if opdef.vjp is None:
            why = vjp_rules.NON_DIFFERENTIABLE.get(op.kind, "no VJP is defined")
            raise GraphError(
                f"autodiff: op {op.name!r} ({op.kind}) lies between a param and the loss but "
                f"is not differentiable: {why}",
                op=op.name,
            )
        ctx.current = op
        dxs = opdef.vjp(ctx, op, dys, needs)
        ctx.current = None
        for x, dx, want in zip(op.inputs, dxs, needs, strict=True):
            if dx is not None and want:
                assert ctx.type(dx) == graph.type_of(x), (op.name, x, ctx.type(dx))
                contribs.setdefault(x, []).append(dx)
    for v in graph.values.values():
        if v.kind == ValueKind.PARAM:
            total(v.name)
    return ctx, grads


#: Param dtypes that get a float32 master copy under AdamW by default.
HALF_DTYPES = frozenset({"bfloat16", "float16"})


def training_graph(
    graph: Graph,
    optimizer: str = "adamw",
    lr: float = 1e-3,
    master_weights: bool | None = None,
    **opt: Any,
) -> Graph:
    """`graph` + backward ops + one optimizer step per param with a gradient.

    `opt`: for adamw `betas`, `eps`, `weight_decay`, `step`; for sgd `weight_decay`.
    Mixed precision (AdamW): a 16-bit param gets a float32 master copy `<p>.master` and
    float32 moments, the update runs on the master and the param is its 16-bit copy: 2 + 2
    + 4 + 4 + 4 = 16 bytes per parameter with its gradient. `master_weights` None means
    "for 16-bit params"; `graph.meta["master_weights"]` maps each master to its param.
    Outputs: the loss, every new param and every new state value.
    """
    if optimizer not in OPTIMIZERS:
        raise GraphError(f"autodiff: unknown optimizer {optimizer!r}; expected adamw or sgd")
    defaults = ADAMW_DEFAULTS if optimizer == "adamw" else SGD_DEFAULTS
    unknown = set(opt) - set(defaults)
    if unknown:
        raise GraphError(f"autodiff: {optimizer} has no option(s) {sorted(unknown)}")
    attrs: dict[str, Any] = {"lr": float(lr), **defaults, **opt}
    loss = find_loss(graph)
    ctx, grads = backward(graph, loss)
    outputs = [loss]
    masters: dict[str, str] = {}
    for param in graph.values_of_kind(ValueKind.PARAM):
        p = param.name
        if p not in grads or graph.producer(p) is not None:
            continue
        ins = [p, grads[p]]
        names = [f"{p}.new"]
        if optimizer == "adamw":
            mixed = param.type.dtype in HALF_DTYPES if master_weights is None else master_weights
            state_type = param.type.with_dtype("float32") if mixed else param.type
            for s in ("exp_avg", "exp_avg_sq", *(["master"] if mixed else [])):
                ctx.values[f"{p}.{s}"] = Value(f"{p}.{s}", state_type, ValueKind.STATE)
                ins.append(f"{p}.{s}")
                names.append(f"{p}.{s}.new")
            if mixed:
                masters[f"{p}.master"] = p
        kinds = [ValueKind.PARAM] + [ValueKind.STATE] * (len(names) - 1)
        inplace = [0] if optimizer == "sgd" else [0, *range(2, len(ins))]
        ctx.emit(optimizer, ins, {**attrs, "inplace": inplace}, role=OpRole.OPTIMIZER,
                 names=names, kinds=kinds, op_name=f"{p}.{optimizer}")  # fmt: skip
        outputs += names
    return Graph(
        ctx.values.values(),
        [*graph.ops, *ctx.finish()],
        name=f"{graph.name}.train",
        outputs=outputs,
        meta={**graph.meta, "optimizer": optimizer, "loss": loss, "master_weights": masters},
    )
