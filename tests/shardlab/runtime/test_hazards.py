"""Async-comm hazards: the static checker and random interleavings on the simulated mesh.

Real lowered plans must be clean and give bit-identical blocks under every interleaving;
programs broken on purpose (a dropped dependency, a free or an in-place write racing a comm,
a use after free) must be named by `check_hazards` and caught by some interleaving.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest

from shardlab.errors import ExecutionError
from shardlab.ir import OpRole
from shardlab.models import build_model
from shardlab.ops.base import Array
from shardlab.plan import Plan, build_plan
from shardlab.program import DistOp, DistProgram
from shardlab.runtime.hazards import HappensBefore, Hazard, HazardError, check_hazards
from shardlab.runtime.reference import run_reference, source_values
from shardlab.runtime.simulated import Blocks, run_interleavings, run_simulated
from shardlab.strategy import Strategy

LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 8, "dtype": "float32"}  # fmt: skip
PARAM = "layers.0.attn.k_proj.weight"
GRAD = f"{PARAM}.grad"
SEEDS = range(50)


def _plan(mesh: str = "dp=2,tp=2", templates: tuple[str, ...] = ("dp", "megatron_tp")) -> Plan:
    return build_plan(
        build_model("llama3-8b", LLAMA), Strategy.build(mesh, list(templates)), passes=False
    )


def _sources(plan: Plan) -> dict[str, Array]:
    env = run_reference(plan.training, seed=0)
    return {v.name: env[v.name] for v in source_values(plan.training)}


@pytest.fixture(scope="module")
def plan() -> Plan:
    return _plan()


@pytest.fixture(scope="module")
def sources(plan: Plan) -> dict[str, Array]:
    return _sources(plan)


@pytest.fixture(scope="module")
def program_order(plan: Plan, sources: dict[str, Array]) -> Blocks:
    return run_simulated(plan.program, sources, seed=0)


def _assert_identical(want: Blocks, got: Blocks) -> None:
    assert want.keys() == got.keys()
    for name, ranks in want.items():
        for r, block in ranks.items():
            assert np.array_equal(block, got[name][r]), (name, r)


def _at(program: DistProgram, name: str) -> int:
    return next(i for i, op in enumerate(program.ops) if op.name == name)


def _reduce_and_step(program: DistProgram) -> tuple[int, int]:
    """Indices of PARAM's gradient all-reduce and of its optimizer step."""
    step = _at(program, f"{PARAM}.adamw")
    reduce = next(i for i, op in enumerate(program.ops) if op.outputs == (f"{GRAD}@RS(1)",))
    assert program.ops[reduce].kind == "all_reduce" and program.ops[reduce].stream == "comm:dp"
    return reduce, step


def _edit(
    program: DistProgram,
    ops: list[DistOp],
    new_values: Mapping[str, str] | None = None,
) -> DistProgram:
    """`program` with `ops`; each new value takes the type and spec of the value it copies."""
    copies = dict(new_values or {})
    types = {**program.types, **{v: program.types[src] for v, src in copies.items()}}
    specs = {**program.specs, **{v: program.specs[src] for v, src in copies.items()}}
    return replace(program, ops=ops, types=types, specs=specs)


def _sync_op(kind: str, name: str, inputs: tuple[str, ...], deps: tuple[str, ...]) -> DistOp:
    return DistOp(name, kind, inputs, (), "compute", OpRole.COMM, deps=deps)


def _caught(program: DistProgram, sources: Mapping[str, Array]) -> list[Hazard]:
    """The hazard each interleaving of SEEDS raised (runs without one are left out)."""
    caught = []
    for seed in SEEDS:
        try:
            run_simulated(program, sources, seed=0, interleave=seed)
        except HazardError as err:
            caught.append(err.hazard)
    return caught


def _pairs(hazards: list[Hazard]) -> set[tuple[str, str, str, str]]:
    return {(h.kind, h.op, h.other, h.value) for h in hazards}


# -- real programs are clean ---------------------------------------------------------------


def test_lowered_plan_is_hazard_free(plan: Plan) -> None:
    assert check_hazards(plan.program) == []


def test_fifty_interleavings_match_program_order(
    plan: Plan, sources: dict[str, Array], program_order: Blocks
) -> None:
    blocks = run_interleavings(plan.program, sources, n=50, seed=0)
    _assert_identical(program_order, blocks)


@pytest.mark.parametrize(
    ("mesh", "templates"),
    [
        ("dp=2,tp=2", ("dp", "megatron_tp", "sequence_parallel")),
        ("pp=2,dp=2,tp=2", ("dp", "megatron_tp", "sequence_parallel")),
        ("dp=4", ("dp", "fsdp")),
    ],
)
def test_other_strategies_are_clean_under_interleavings(
    mesh: str, templates: tuple[str, ...]
) -> None:
    plan = _plan(mesh, templates)
    assert check_hazards(plan.program) == []
    sources = _sources(plan)
    want = run_simulated(plan.program, sources, seed=0)
    _assert_identical(want, run_interleavings(plan.program, sources, n=8, seed=100))


def test_interleavings_really_reorder_comm_against_compute(plan: Plan) -> None:
    """Async ops complete at different points in different runs, else the test proves little."""
    from shardlab.runtime.simulated import _Analysis, random_events

    analysis = _Analysis.of(plan.program, interleaved=True)
    assert analysis.preds is not None
    orders = {
        tuple(random_events(analysis.preds, analysis.asynchronous, random.Random(seed)))
        for seed in range(5)
    }
    assert len(orders) == 5


# -- broken on purpose -----------------------------------------------------------------------


def test_dropped_dependency_on_the_all_reduce_is_read_before_complete(
    plan: Plan, sources: dict[str, Array]
) -> None:
    program = plan.program
    reduce, step = _reduce_and_step(program)
    ops = list(program.ops)
    assert ops[step].deps == (ops[reduce].name,)
    ops[step] = replace(ops[step], deps=())
    broken = _edit(program, ops)
    expected = ("read_before_complete", ops[step].name, ops[reduce].name, f"{GRAD}@RS(1)")
    hazards = check_hazards(broken)
    assert _pairs(hazards) == {expected}
    assert "add a dependency or a wait" in hazards[0].message
    caught = _caught(broken, sources)
    assert caught and _pairs(caught) == {expected}
    run_simulated(broken, sources, seed=0)  # program order hides it


def test_free_of_a_buffer_the_all_reduce_still_reads_is_free_in_flight(
    plan: Plan, sources: dict[str, Array]
) -> None:
    program = plan.program
    reduce, step = _reduce_and_step(program)
    ops = list(program.ops)
    early = _sync_op("free", f"free:{GRAD}", (GRAD,), ())
    broken = _edit(program, [*ops[: reduce + 1], early, *ops[reduce + 1 :]])
    expected = ("free_in_flight", early.name, ops[reduce].name, GRAD)
    assert _pairs(check_hazards(broken)) == {expected}
    assert expected in _pairs(_caught(broken, sources))
    # After the optimizer step (which depends on the all-reduce) the free is safe.
    late = replace(early, deps=(ops[step].name,))
    fixed = _edit(program, [*ops[: step + 1], late, *ops[step + 1 :]])
    assert check_hazards(fixed) == []
    assert _caught(fixed, sources) == []


def test_inplace_write_racing_the_all_reduce_is_write_in_flight(
    plan: Plan, sources: dict[str, Array]
) -> None:
    program = plan.program
    reduce, _ = _reduce_and_step(program)
    ops = list(program.ops)
    producer = ops[reduce].deps
    out = f"{GRAD}.neg"
    clobber = DistOp(
        f"clobber:{GRAD}", "neg", (GRAD,), (out,), "compute", OpRole.BACKWARD,
        attrs={"inplace": [0]}, deps=producer,
    )  # fmt: skip
    broken = _edit(program, [*ops[: reduce + 1], clobber, *ops[reduce + 1 :]], {out: GRAD})
    expected = ("write_in_flight", clobber.name, ops[reduce].name, GRAD)
    assert _pairs(check_hazards(broken)) == {expected}
    assert expected in _pairs(_caught(broken, sources))
    # Ordered after the all-reduce, the write is safe.
    ordered = replace(clobber, deps=(*producer, ops[reduce].name))
    fixed = _edit(program, [*ops[: reduce + 1], ordered, *ops[reduce + 1 :]], {out: GRAD})
    assert check_hazards(fixed) == []
    assert _caught(fixed, sources) == []


def test_reads_after_free_and_after_overwrite(plan: Plan, sources: dict[str, Array]) -> None:
    program = plan.program
    _, step = _reduce_and_step(program)
    ops = list(program.ops)
    grad = f"{GRAD}@RS(1)"
    free = _sync_op("free", f"free:{grad}", (grad,), ())
    late_read = DistOp("late_read", "neg", (grad,), ("late",), "compute", OpRole.BACKWARD)
    after_free = _edit(
        program, [*ops[: step + 1], free, late_read, *ops[step + 1 :]], {"late": grad}
    )
    assert _pairs(check_hazards(after_free)) == {("use_after_free", "late_read", free.name, grad)}
    with pytest.raises(HazardError, match=r"'late_read'.*'free:") as err:
        run_simulated(after_free, sources, seed=0)
    assert err.value.hazard.kind == "use_after_free" and err.value.code == "hazard"
    # The optimizer step overwrote the parameter in place: reading the old version is stale.
    stale = DistOp("stale_read", "neg", (PARAM,), ("stale",), "compute", OpRole.BACKWARD)
    after_step = _edit(program, [*ops[: step + 1], stale, *ops[step + 1 :]], {"stale": PARAM})
    assert _pairs(check_hazards(after_step)) == {
        ("read_after_overwrite", "stale_read", ops[step].name, PARAM)
    }
    with pytest.raises(HazardError, match="overwrites in place"):
        run_simulated(after_step, sources, seed=0)


def test_explicit_waits_holds_and_frees_are_clean(
    plan: Plan, sources: dict[str, Array], program_order: Blocks
) -> None:
    """Every optimizer step waits on its gradient's all-reduce through a `wait`; the reduced
    input is held until then and freed after the step."""
    program = plan.program
    ops: list[DistOp] = []
    inserted = 0
    for op in program.ops:
        comm_deps = [d for d in op.deps if d.startswith("all_reduce:")]
        if op.role != OpRole.OPTIMIZER or len(comm_deps) != 1:
            ops.append(op)
            continue
        reduce = program.ops[_at(program, comm_deps[0])]
        wait = _sync_op("wait", f"wait:{reduce.name}", reduce.outputs, (reduce.name,))
        hold = _sync_op("hold", f"hold:{reduce.name}", reduce.inputs, (wait.name,))
        free = _sync_op("free", f"free:{reduce.name}", (*reduce.inputs, *reduce.outputs), ())
        ops += [wait, hold, replace(op, deps=(wait.name,)), free]
        inserted += 1
    assert inserted == 21
    synced = _edit(program, ops)
    assert check_hazards(synced) == []
    _assert_identical(program_order, run_simulated(synced, sources, seed=0))
    _assert_identical(program_order, run_interleavings(synced, sources, n=20, seed=7))
    # Without the wait's dependency nothing orders the step, the hold or the free after the
    # all-reduce: the wait and the step read early, the free releases buffers it still uses.
    reduce_name = f"all_reduce:{GRAD}@RS(1)"
    first = _at(_edit(program, ops), f"wait:{reduce_name}")
    ops[first] = replace(ops[first], deps=())
    found = {(h.kind, h.op, h.other) for h in check_hazards(_edit(program, ops))}
    step = ops[first + 2].name
    assert found == {
        ("read_before_complete", ops[first].name, reduce_name),
        ("read_before_complete", step, reduce_name),
        ("free_in_flight", ops[first + 3].name, reduce_name),
    }


def test_send_is_async_and_a_later_recv_with_a_hold_keeps_its_buffer_safe(
    plan: Plan, sources: dict[str, Array]
) -> None:
    """Seed 001: no wait on a forward send when a later recv on its stream implies it is done,
    as long as a hold keeps the sent buffer alive until then."""
    program = plan.program
    param = "layers.1.mlp.down_proj.weight"
    x = f"{param}.new"
    send = DistOp(
        "send:x", "send", (x,), (), "comm:pp", OpRole.COMM, attrs={"peer": 1, "tag": "x"},
        deps=(f"{param}.adamw",),
    )  # fmt: skip
    recv = DistOp(
        "recv:y", "recv", (), ("y",), "comm:pp", OpRole.COMM,
        attrs={"peer": 1, "tag": "y", "shape": [1], "dtype": "float32"},
    )  # fmt: skip
    hold = _sync_op("hold", "hold:x", (x,), ("recv:y",))
    free = _sync_op("free", "free:x", (x,), ())
    base = list(program.ops)
    early = _edit(program, [*base, send, free, recv])
    assert _pairs(check_hazards(early)) == {("free_in_flight", "free:x", "send:x", x)}
    safe = _edit(program, [*base, send, recv, hold, free])
    assert check_hazards(safe) == []
    clobber = DistOp(
        "clobber:x", "neg", (x,), ("x2",), "compute", OpRole.BACKWARD, attrs={"inplace": [0]},
        deps=(base[-1].name,),
    )  # fmt: skip
    racing = _edit(program, [*base, send, clobber, recv], {"x2": x})
    assert _pairs(check_hazards(racing)) == {("write_in_flight", "clobber:x", "send:x", x)}
    with pytest.raises(ExecutionError, match="send does not run on the simulated mesh"):
        run_simulated(safe, sources, seed=0, interleave=0)


def test_malformed_dependencies_are_named(plan: Plan) -> None:
    ops = list(plan.program.ops)
    ops[0] = replace(ops[0], deps=(ops[1].name,))
    with pytest.raises(ExecutionError, match="not earlier in program order"):
        check_hazards(_edit(plan.program, ops))
    ops[0] = replace(ops[0], deps=("nope",))
    with pytest.raises(ExecutionError, match="'nope', which is not in the program"):
        check_hazards(_edit(plan.program, ops))


# -- the happens-before index -----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_vector_clocks_agree_with_the_transitive_closure(seed: int) -> None:
    rng = random.Random(seed)
    ops: list[DistOp] = []
    for i in range(60):
        deps = tuple({f"op{rng.randrange(i)}" for _ in range(rng.randrange(3) if i else 0)})
        stream = rng.choice(["compute", "comm:dp", "comm:tp", "comm:pp"])
        ops.append(DistOp(f"op{i}", "x", (), (), stream, OpRole.FORWARD, deps=deps))
    preds: list[set[int]] = []
    last: dict[str, int] = {}
    for i, op in enumerate(ops):
        direct = {int(d[2:]) for d in op.deps} | ({last[op.stream]} if op.stream in last else set())
        preds.append(set().union(*({p} | preds[p] for p in direct)) if direct else set())
        last[op.stream] = i
    hb = HappensBefore(ops)
    for b in range(len(ops)):
        for a in range(len(ops)):
            assert hb.before(a, b) == (a in preds[b]), (a, b)


def test_check_hazards_is_fast_on_a_full_size_training_program() -> None:
    plan = build_plan(
        build_model("llama3-8b"), Strategy.build("dp=8,tp=8", ["dp", "megatron_tp"]), passes=False
    )
    n = len(plan.program.ops)
    start = time.perf_counter()
    hazards = check_hazards(plan.program)
    took = time.perf_counter() - start
    print(f"check_hazards: llama3-8b (32 layers) dp=8,tp=8, {n} ops: {took * 1e3:.1f} ms")
    assert n >= 2900 and hazards == []
    assert took < 5.0


def test_sync_kinds_register_in_the_catalog() -> None:
    """Run in a fresh interpreter: importing `shardlab.ops.sync_ops` adds kinds to the global
    catalog, which the catalog-wide tests of this session do not list yet."""
    code = (
        "import json; from shardlab.ops import get_op, infer_types; import shardlab.ops.sync_ops\n"
        "from shardlab.ir import TensorType\n"
        "t = TensorType((2, 3), 'float32')\n"
        "out = {k: [len(infer_types(k, [t], {})), get_op(k).numpy_impl([], {}),"
        " get_op(k).bytes([t], [], {})] for k in ('wait', 'hold', 'free')}\n"
        "out['send'] = len(infer_types('send', [t], {'peer': 1, 'tag': 'a'}))\n"
        "out['recv'] = str(infer_types('recv', [], {'peer': {'0': 1}, 'shape': [4],"
        " 'dtype': 'float32'})[0])\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == {
        "wait": [0, [], 0],
        "hold": [0, [], 0],
        "free": [0, [], 0],
        "send": 0,
        "recv": "float32[4]",
    }
