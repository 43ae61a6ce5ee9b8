"""The training graph: forward ops, backward ops from each kind's VJP, optimizer ops.

`training_graph(graph, optimizer="adamw", lr=1e-3, **opt)` differentiates the scalar loss
(the output of the op with role `loss`, else the graph's only scalar float output) with
respect to every float param it depends on:

- the seed d(loss) = 1 is a `fill` op writing `<loss>.grad`;
- ops are visited in reverse topological order; each op's VJP (`shardlab.vjp_rules`) emits
  backward ops (role backward, the forward op's scope) for the inputs that need a gradient;
- a VJP may have its forward op keep a statistic for the backward (`keep_output`: the cross
  entropy's log-sum-exp per label); the training graph holds the widened forward op;
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
from shardlab.recompute import OP_SUFFIX as RECOMPUTE_SUFFIX
from shardlab.recompute import apply_recompute, check_policy

OPTIMIZERS = ("adamw", "sgd")
#: Backward ops that a forward op's VJP emits are named `<forward op>.bwd<n>`.
BACKWARD_SUFFIX = ".bwd"

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
        #: forward op name -> the op with the extra outputs its backward reads (`keep_output`)
        self.widened: dict[str, Op] = {}

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
        name = op_name or self._fresh(f"{fwd.name}{BACKWARD_SUFFIX}" if fwd else f"{kind}.")
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

    def keep_output(self, op: Op, attrs: dict[str, Any]) -> str:
        """Have the forward `op` run with `attrs` added, which give its kind one more output
        (a statistic its backward reads instead of recomputing it), named `<op>.<attr>`;
        `forward_ops` puts the widened op in the training graph. Returns that output."""
        types = infer_types(op.kind, [self.type(v) for v in op.inputs], {**op.attrs, **attrs})
        assert len(types) == len(op.outputs) + 1, (op.name, attrs)
        name = f"{op.name}.{'.'.join(attrs)}"
        if name in self.values:
            raise GraphError(f"autodiff: value name {name!r} is already taken", value=name)
        self.values[name] = Value(name, types[-1], ValueKind.ACTIVATION)
        self.widened[op.name] = Op(op.name, op.kind, op.inputs, (*op.outputs, name),
                                   {**op.attrs, **attrs}, op.scope, op.role)  # fmt: skip
        return name

    def forward_ops(self) -> list[Op]:
        """The forward graph's ops, those that `keep_output` widened in their place."""
        return [self.widened.get(op.name, op) for op in self.graph.ops]

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


def forward_op_of(name: str) -> str | None:
    """The forward op whose VJP emitted the backward op `name`, or that a recomputed op
    replays (`<op>.recompute`, `shardlab.recompute`), or None (gradient sums, seeds, copies
    and optimizer ops are named otherwise)."""
    if name.endswith(RECOMPUTE_SUFFIX):
        return name[: -len(RECOMPUTE_SUFFIX)]
    head, sep, tail = name.rpartition(BACKWARD_SUFFIX)
    return head if sep and head and tail.isdigit() else None


def find_loss(graph: Graph) -> str:
    """The scalar loss value of `graph`."""
    loss_ops = [op for op in graph.ops if op.role == OpRole.LOSS]
    # A loss op's first output is the loss (a training graph's cross entropy also outputs
    # its log-sum-exp per label, `keep_output`).
    cands = [op.outputs[0] for op in loss_ops] if loss_ops else list(graph.outputs)
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


def backward(
    graph: Graph, loss: str | None = None, half_grads: frozenset[str] = frozenset()
) -> tuple[BackwardContext, dict[str, str]]:
    """Emit the backward ops of `graph`; returns the context and value -> its grad value.
    The gradient of `v` is named `<v>.grad`, or `<v>.grad16` for the params in `half_grads`
    (their float32 main gradient takes the `.grad` name, `training_graph`)."""
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
        name = f"{v}{HALF_GRAD_SUFFIX if v in half_grads else '.grad'}"
        acc = parts[0]
        for i, part in enumerate(parts[1:], start=1):
            last = i == len(parts) - 1
            acc = ctx.emit("add", [acc, part], names=[name] if last else None,
                           kinds=[ValueKind.GRAD] if last else None,
                           op_name=f"{v}.grad_acc" + ("" if last else str(i)))[0]  # fmt: skip
        if len(parts) == 1 and acc not in claimed and acc != name:
            acc = ctx.rename(acc, name)
        elif acc != name and graph.value(v).kind == ValueKind.PARAM:
            shape = list(graph.type_of(v).shape)  # an alias: copy it under the grad's name
            acc = ctx.emit("reshape", [acc], {"shape": shape}, names=[name],
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


#: The 16-bit gradient a mixed-precision param's float32 main gradient is cast from.
HALF_GRAD_SUFFIX = ".grad16"


def gradient_of(name: str) -> str | None:
    """The value whose gradient `name` holds (`<v>.grad`, or the 16-bit `<v>.grad16` of a
    mixed-precision param), else None."""
    for suffix in (".grad", HALF_GRAD_SUFFIX):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return None


def _main_grad(ctx: BackwardContext, param: str, half: str) -> str:
    """Megatron's fp32 main gradient: the 16-bit gradient `<p>.grad16` cast to float32 as
    `<p>.grad`, which micro-batches accumulate into, data parallelism reduces and the
    optimizer reads (bf16 training accumulates and all-reduces gradients in fp32)."""
    (main,) = ctx.emit("main_grad", [half], names=[f"{param}.grad"], kinds=[ValueKind.GRAD],
                       op_name=f"{param}.main_grad")  # fmt: skip
    return main


def _main_grads_after_their_gradient(ops: list[Op]) -> list[Op]:
    """`ops` with each `main_grad` moved right after the op that completes its 16-bit
    gradient: the float32 main gradient exists from then on, as Megatron's buffer does."""
    casts = {op.inputs[0]: op for op in ops if op.kind == "main_grad"}
    out: list[Op] = []
    for op in ops:
        if op.kind == "main_grad":
            continue
        out.append(op)
        out += [casts[v] for v in op.outputs if v in casts]
    return out


def training_graph(
    graph: Graph,
    optimizer: str = "adamw",
    lr: float = 1e-3,
    master_weights: bool | None = None,
    recompute: str = "none",
    **opt: Any,
) -> Graph:
    """`graph` + backward ops + one optimizer step per param with a gradient.

    `opt`: for adamw `betas`, `eps`, `weight_decay`, `step`; for sgd `weight_decay`.
    Mixed precision (AdamW): a 16-bit param gets a float32 master copy `<p>.master` and
    float32 moments, the update runs on the master and the param is its 16-bit copy; its
    gradient is cast to a float32 main gradient `<p>.grad` (Megatron-LM's accounting: 2 + 4
    + 4 + 4 + 4 = 18 bytes per parameter with its gradient). `master_weights` None means
    "for 16-bit params"; `graph.meta["master_weights"]` maps each master to its param.
    `recompute` (none, selective, full) replays part of each layer's forward before its
    backward instead of keeping it (`shardlab.recompute`).
    Outputs: the loss, every new param and every new state value.
    """
    if optimizer not in OPTIMIZERS:
        raise GraphError(f"autodiff: unknown optimizer {optimizer!r}; expected adamw or sgd")
    check_policy(recompute)
    defaults = ADAMW_DEFAULTS if optimizer == "adamw" else SGD_DEFAULTS
    unknown = set(opt) - set(defaults)
    if unknown:
        raise GraphError(f"autodiff: {optimizer} has no option(s) {sorted(unknown)}")
    attrs: dict[str, Any] = {"lr": float(lr), **defaults, **opt}
    loss = find_loss(graph)
    params = [p for p in graph.values_of_kind(ValueKind.PARAM) if graph.producer(p.name) is None]
    mixed = {
        p.name
        for p in params
        if optimizer == "adamw"
        and (p.type.dtype in HALF_DTYPES if master_weights is None else master_weights)
    }
    half = frozenset(p.name for p in params if p.name in mixed and p.type.dtype != "float32")
    ctx, grads = backward(graph, loss, half)
    outputs = [loss]
    masters: dict[str, str] = {}
    for param in params:
        p = param.name
        if p not in grads:
            continue
        if p in half:
            grads[p] = _main_grad(ctx, p, grads[p])
        ins = [p, grads[p]]
        names = [f"{p}.new"]
        if optimizer == "adamw":
            state_type = param.type.with_dtype("float32") if p in mixed else param.type
            for s in ("exp_avg", "exp_avg_sq", *(["master"] if p in mixed else [])):
                ctx.values[f"{p}.{s}"] = Value(f"{p}.{s}", state_type, ValueKind.STATE)
                ins.append(f"{p}.{s}")
                names.append(f"{p}.{s}.new")
            if p in mixed:
                masters[f"{p}.master"] = p
        kinds = [ValueKind.PARAM] + [ValueKind.STATE] * (len(names) - 1)
        inplace = [0] if optimizer == "sgd" else [0, *range(2, len(ins))]
        ctx.emit(optimizer, ins, {**attrs, "inplace": inplace}, role=OpRole.OPTIMIZER,
                 names=names, kinds=kinds, op_name=f"{p}.{optimizer}")  # fmt: skip
        outputs += names
    train = Graph(
        ctx.values.values(),
        [*ctx.forward_ops(), *_main_grads_after_their_gradient(ctx.finish())],
        name=f"{graph.name}.train",
        outputs=outputs,
        meta={**graph.meta, "optimizer": optimizer, "loss": loss, "master_weights": masters},
    )
    return apply_recompute(train, recompute)


def training_graph_of(graph: Graph, optimizer: str, lr: float, recompute: str) -> Graph:
    """`training_graph(graph, optimizer, lr, recompute=recompute)`, built once per setting
    and kept on `graph` (graphs are not changed once built, as `repeats_of` also assumes):
    plans of one model under many strategies, as a search makes, share it and the caches
    kept on it."""
    known: dict[tuple[str, float, str], Graph] = graph.__dict__.setdefault("_training", {})
    key = (optimizer, float(lr), recompute)
    if key not in known:
        known[key] = training_graph(graph, optimizer=optimizer, lr=lr, recompute=recompute)
    return known[key]
