"""Timeline: a discrete-event simulation of one step of a `DistProgram` over ranks x streams.

What it is for: turn per-op durations (from the compute and comm cost models, or measured)
into a step time and a per-rank schedule that shows which communication hides behind compute.

Semantics, per rank:

- every rank runs the program's ops; ops on one stream run one at a time in program order;
  an op starts when its stream is free and all its `deps` on the same rank have finished
  (deps on ops that do not run on that rank, e.g. a send of another rank, are ignored);
  streams order against each other only through deps (`comm:<axis>` is its own lane);
- a collective starts on every rank of its group at once, when the last member is ready
  (rendezvous), and ends on all of them at start + the longest member duration; it holds its
  stream while it waits. Local comm steps (`local_slice`, `local_partial`) need no partner;
- `send` / `recv` ops carry attrs `peer` and optionally `tag` (see `peer_of`). A send is eager:
  it ends at its start + its duration. A recv pairs with the sends from its peer with the same
  tag in order and ends at max(recv start + recv duration, send start + send duration);
- overlap slowdown s: a compute op progresses at 1 / (1 + s) of its speed while any comm op
  runs on its rank, so each second of its work that overlaps comm takes 1 + s seconds
  (comm ops are not slowed). With s = 0 every op takes exactly its duration.

Symmetry: ranks are grouped into roles, by `role_of` or else by their vector of durations.
With one role, one representative rank is simulated alone (every rendezvous is trivially met:
all members are in the same state) and stands for every rank. With several roles, each
connected set of ranks (linked by collectives and send/recv) that holds one role is again
simulated by one representative; a mixed set is simulated rank by rank with true rendezvous.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardlab.errors import ShardlabError
from shardlab.mesh import Mesh
from shardlab.program import DistOp, DistProgram

COMPUTE = "compute"
SEND = "send"
RECV = "recv"

Durations = Callable[[DistOp, int], float]
GroupOf = Callable[[DistOp, int], tuple[int, ...]]
RoleOf = Callable[[int], Hashable]
Row = tuple[float | None, ...]
Interval = tuple[float, float]
#: (op index, start, end) of every op one rank ran
Schedule = list[tuple[int, float, float]]


class SimulationError(ShardlabError):
    """A program cannot be simulated: a bad duration, a dep on an unknown op, a collective or
    recv that never meets its partners."""

    code = "simulation_error"


def peer_of(op: DistOp, rank: int) -> int | None:
    """The other end of a send/recv on `rank`; None where the op does not run.

    `attrs["peer"]` is a rank (the op runs on every other rank) or a map rank -> peer (the op
    runs on the ranks it names; keys may be strings, as after a JSON round trip).
    """
    peer = op.attrs.get("peer")
    if isinstance(peer, Mapping):
        got = peer.get(rank, peer.get(str(rank)))
        return None if got is None else int(got)
    if isinstance(peer, int) and not isinstance(peer, bool):
        return None if peer == rank else peer
    raise SimulationError(
        f"{op.kind} op {op.name!r} needs attrs['peer']: a rank or a map rank -> peer",
        op=op.name,
    )


def same_role(rank: int) -> int:
    """`role_of` for SPMD programs whose durations do not depend on the rank: one role."""
    return 0


def default_group_of(mesh: Mesh) -> GroupOf:
    """Who must meet for an op on a rank: the mesh group of a collective's axis, both ends of
    a send/recv, and the rank alone for everything else (local comm steps, compute)."""

    groups: dict[tuple[int, str], tuple[int, ...]] = {}

    def group_of(op: DistOp, rank: int) -> tuple[int, ...]:
        if op.kind in (SEND, RECV):
            peer = peer_of(op, rank)
            return (rank,) if peer is None else tuple(sorted({rank, peer}))
        if op.is_collective:
            assert op.comm is not None
            key = (rank, op.comm.axis)
            if key not in groups:
                groups[key] = mesh.group_of(rank, op.comm.axis)
            return groups[key]
        return (rank,)

    return group_of


@dataclass(frozen=True, slots=True)
class Event:
    """One op as it ran on one rank: when, on which stream, and (comm) how much was exposed."""

    name: str
    kind: str
    stream: str
    role: str
    scope: str
    start: float
    end: float
    bytes: float = 0.0
    #: seconds of this comm op during which no compute op ran on the rank (0 for compute)
    exposed: float = 0.0

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def is_comm(self) -> bool:
        return self.stream != COMPUTE

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "stream": self.stream,
            "role": self.role,
            "scope": self.scope,
            "start": self.start,
            "end": self.end,
            "bytes": self.bytes,
            "exposed": self.exposed,
        }


@dataclass(frozen=True, slots=True)
class Timeline:
    """The simulated step: events per representative rank and which rank each one stands for.

    Per-rank queries accept any rank in `rank_of_role` and answer for its representative.
    """

    step_time: float
    events: dict[int, list[Event]]
    rank_of_role: dict[int, int]
    overlap_slowdown: float = 0.0

    def events_of(self, rank: int) -> list[Event]:
        """The events of `rank` (those of its representative)."""
        rep = self.rank_of_role.get(rank)
        if rep is None:
            raise SimulationError(f"rank {rank} is not in this timeline", rank=rank)
        return self.events[rep]

    def ranks_of(self, rep: int) -> list[int]:
        """The ranks a representative stands for."""
        return sorted(r for r, p in self.rank_of_role.items() if p == rep)

    def end_time(self, rank: int) -> float:
        """When the last op of `rank` ends."""
        return max((e.end for e in self.events_of(rank)), default=0.0)

    def compute_time(self, rank: int) -> float:
        """Seconds the compute stream of `rank` is busy."""
        return sum(e.duration for e in self.events_of(rank) if not e.is_comm)

    def comm_time(self, rank: int) -> float:
        """Seconds during which at least one comm op runs on `rank` (union over comm streams)."""
        return _measure(_union([(e.start, e.end) for e in self.events_of(rank) if e.is_comm]))

    def exposed_comm(self, rank: int) -> float:
        """Comm busy time of `rank` not overlapped by any compute on it."""
        events = self.events_of(rank)
        comm = _union([(e.start, e.end) for e in events if e.is_comm])
        compute = _union([(e.start, e.end) for e in events if not e.is_comm])
        return _measure(comm) - _overlap(comm, compute)

    def overlap_fraction(self, rank: int) -> float:
        """Share of the comm busy time of `rank` hidden behind compute (0 without comm)."""
        total = self.comm_time(rank)
        return (total - self.exposed_comm(rank)) / total if total > 0 else 0.0

    def busy_by_scope(self, rank: int) -> dict[str, float]:
        """Compute seconds per scope prefix (`layers`, `layers.0`, `layers.0.attn`, ...);
        the key "" holds all compute."""
        out: dict[str, float] = {}
        for e in self.events_of(rank):
            if e.is_comm:
                continue
            parts = e.scope.split(".") if e.scope else []
            for key in ["", *(".".join(parts[: i + 1]) for i in range(len(parts)))]:
                out[key] = out.get(key, 0.0) + e.duration
        return dict(sorted(out.items()))

    def to_json(self) -> dict[str, Any]:
        """Everything, JSON-ready (rank keys as strings)."""
        return {
            "step_time": self.step_time,
            "overlap_slowdown": self.overlap_slowdown,
            "rank_of_role": {str(r): p for r, p in sorted(self.rank_of_role.items())},
            "ranks": {
                str(rep): {
                    "stands_for": self.ranks_of(rep),
                    "end_time": self.end_time(rep),
                    "compute_time": self.compute_time(rep),
                    "comm_time": self.comm_time(rep),
                    "exposed_comm": self.exposed_comm(rep),
                    "overlap_fraction": self.overlap_fraction(rep),
                    "events": [e.to_json() for e in events],
                }
                for rep, events in sorted(self.events.items())
            },
        }


def mfu(model_flops_per_step: float, step_time: float, n_devices: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: model FLOPs per step / (step time x devices x peak FLOP/s)."""
    if step_time <= 0 or n_devices <= 0 or peak_flops <= 0:
        raise SimulationError(
            f"mfu needs a positive step time, device count and peak ({step_time}, {n_devices}, "
            f"{peak_flops})"
        )
    return model_flops_per_step / (step_time * n_devices * peak_flops)


def tokens_per_second(tokens_per_step: float, step_time: float) -> float:
    """Training throughput: tokens per step / step time."""
    if step_time <= 0:
        raise SimulationError(f"tokens_per_second needs a positive step time, got {step_time}")
    return tokens_per_step / step_time


def simulate(
    program: DistProgram,
    durations: Durations,
    *,
    group_of: GroupOf | None = None,
    overlap_slowdown: float = 0.0,
    ranks: Sequence[int] | None = None,
    role_of: RoleOf | None = None,
) -> Timeline:
    """Simulate one step of `program` on `ranks` (default: every rank of its mesh).

    `durations(op, rank)` gives seconds; `group_of(op, rank)` the ranks that meet for a comm
    op (default `default_group_of(program.mesh)`); `role_of(rank)` declares which ranks behave
    alike (pass `same_role` for an SPMD program with rank-independent durations: durations are
    then asked for one rank only); without it roles come from each rank's durations. Ranks
    outside `ranks` that share a collective with them are simulated too but not reported;
    `step_time` is the latest end over the reported ranks.
    """
    if not overlap_slowdown >= 0:
        raise SimulationError(f"overlap_slowdown must be >= 0, got {overlap_slowdown}")
    group_of = group_of or default_group_of(program.mesh)
    reported = sorted(set(program.mesh.ranks if ranks is None else ranks))
    unknown = sorted(set(reported) - set(program.mesh.ranks))
    if unknown or not reported:
        raise SimulationError(
            f"ranks {unknown or '[]'} are not ranks of mesh {program.mesh}", ranks=unknown
        )
    rows = _Rows(program.ops, durations)
    universe = reported if ranks is None else _closure(program, reported, group_of)
    role: dict[int, Hashable] = {r: (role_of or rows.row)(r) for r in universe}
    if len(set(role.values())) == 1:
        runs = [([reported[0]], universe)]
    else:
        runs = _runs(program, universe, role, group_of)
    schedules: dict[int, Schedule] = {}
    rank_of_role: dict[int, int] = {}
    wanted = set(reported)
    for simulated, stands_for in runs:
        shown = sorted(wanted.intersection(stands_for))
        if not shown:
            continue
        solo = len(simulated) == 1
        sim_rows = {r: rows.row(r) for r in simulated}
        result = _Engine(program.ops, sim_rows, group_of, overlap_slowdown, solo).run()
        first: dict[tuple[tuple[int, float, float], ...], int] = {}
        for r in shown:
            schedule = result[simulated[0]] if solo else result[r]
            rep = shown[0] if solo else first.setdefault(tuple(schedule), r)
            rank_of_role[r] = rep
            schedules.setdefault(rep, schedule)
    events = {rep: _events(program.ops, schedule) for rep, schedule in sorted(schedules.items())}
    step = max((e.end for evs in events.values() for e in evs), default=0.0)
    return Timeline(step, events, dict(sorted(rank_of_role.items())), overlap_slowdown)


class _Rows:
    """Durations per rank (None where an op does not run there), each asked for once."""

    def __init__(self, ops: Sequence[DistOp], durations: Durations) -> None:
        self.ops = ops
        self.durations = durations
        self.rows: dict[int, Row] = {}

    def row(self, rank: int) -> Row:
        if rank not in self.rows:
            self.rows[rank] = tuple(self._ask(op, rank) for op in self.ops)
        return self.rows[rank]

    def _ask(self, op: DistOp, rank: int) -> float | None:
        if op.kind in (SEND, RECV) and peer_of(op, rank) is None:
            return None
        d = float(self.durations(op, rank))
        if not (math.isfinite(d) and d >= 0):
            raise SimulationError(
                f"duration of op {op.name!r} on rank {rank} is {d}; it must be finite and >= 0",
                op=op.name,
                rank=rank,
            )
        return d


def _linked(program: DistProgram, rank: int, group_of: GroupOf) -> set[int]:
    """Every rank that `rank` meets in a collective or a send/recv."""
    out: set[int] = set()
    for op in program.ops:
        if op.is_collective or (op.kind in (SEND, RECV) and peer_of(op, rank) is not None):
            out.update(group_of(op, rank))
    return out


def _closure(program: DistProgram, ranks: Sequence[int], group_of: GroupOf) -> list[int]:
    """`ranks` and every rank they meet, transitively."""
    seen = set(ranks)
    todo = list(ranks)
    while todo:
        for other in _linked(program, todo.pop(), group_of) - seen:
            seen.add(other)
            todo.append(other)
    return sorted(seen)


def _runs(
    program: DistProgram, universe: list[int], role: dict[int, Hashable], group_of: GroupOf
) -> list[tuple[list[int], list[int]]]:
    """The simulations to run, as (ranks simulated, ranks they stand for): one rank per role
    for the connected sets of ranks that hold one role, and every rank of each mixed set."""
    parent = {r: r for r in universe}

    def find(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for r in universe:
        for other in _linked(program, r, group_of):
            if other not in parent:
                raise SimulationError(
                    f"rank {r} meets rank {other}, which is not in mesh {program.mesh}"
                )
            parent[find(other)] = find(r)
    sets: dict[int, list[int]] = {}
    for r in universe:
        sets.setdefault(find(r), []).append(r)
    runs: list[tuple[list[int], list[int]]] = []
    uniform: dict[Hashable, list[int]] = {}
    for members in sets.values():
        if len({role[r] for r in members}) > 1:
            runs.append((members, members))
        else:
            uniform.setdefault(role[members[0]], []).extend(members)
    runs += [([members[0]], members) for members in uniform.values()]
    return runs


@dataclass(slots=True)
class _Slowed:
    """A running compute op whose speed depends on the comm activity on its rank."""

    index: int
    work: float  # seconds of work left at `since`
    since: float
    factor: float  # wall seconds per second of work since `since`


class _Engine:
    """Event-driven run of some ranks; `solo`: one rank standing for identical peers, so
    collectives start as soon as it is ready and a recv pairs with its own send."""

    def __init__(
        self,
        ops: Sequence[DistOp],
        rows: dict[int, Row],
        group_of: GroupOf,
        slowdown: float,
        solo: bool,
    ) -> None:
        self.ops, self.rows, self.group_of = ops, rows, group_of
        self.slowdown, self.solo = slowdown, solo
        index = {op.name: i for i, op in enumerate(ops)}
        self.deps: list[tuple[int, ...]] = []
        for op in ops:
            unknown = [d for d in op.deps if d not in index]
            if unknown:
                raise SimulationError(
                    f"op {op.name!r} depends on unknown ops {unknown}", op=op.name, deps=unknown
                )
            self.deps.append(tuple(index[d] for d in op.deps))
        self.comm = [op.stream != COMPUTE for op in ops]
        self.queues: dict[int, dict[str, deque[int]]] = {}
        for r, row in rows.items():
            queues: dict[str, deque[int]] = {}
            for i, op in enumerate(ops):
                if row[i] is not None:
                    queues.setdefault(op.stream, deque()).append(i)
            self.queues[r] = queues
        self.busy: set[tuple[int, str]] = set()
        self.start: dict[tuple[int, int], float] = {}
        self.end: dict[tuple[int, int], float] = {}
        self.active = dict.fromkeys(rows, 0)  # comm ops running per rank
        self.slowed: dict[int, list[_Slowed]] = {r: [] for r in rows}
        self.version: dict[tuple[int, int], int] = {}
        self.heap: list[tuple[float, int, int, int, int]] = []  # end, tick, rank, op, version
        self.tick = 0
        self.arrived: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        self.sends: dict[tuple[int, int, str], deque[tuple[float, float]]] = {}
        self.recvs: dict[tuple[int, int, str], deque[tuple[int, int, float]]] = {}

    def run(self) -> dict[int, Schedule]:
        """Simulate to the end; the schedule of every rank."""
        dirty, t = set(self.rows), 0.0
        while True:
            self._start_ready(dirty, t)
            dirty = set()
            if not self.heap:
                break
            t = self.heap[0][0]
            while self.heap and self.heap[0][0] <= t:
                _, _, r, i, version = heapq.heappop(self.heap)
                if version == self.version[(r, i)]:
                    self._finish(r, i, t)
                    dirty.add(r)
        self._check_finished()
        return {
            r: [
                (i, self.start[(r, i)], self.end[(r, i)])
                for i, d in enumerate(row)
                if d is not None
            ]
            for r, row in self.rows.items()
        }

    def _start_ready(self, ranks: set[int], t: float) -> None:
        for r in sorted(ranks):
            row = self.rows[r]
            for stream, queue in self.queues[r].items():
                if not queue or (r, stream) in self.busy:
                    continue
                i = queue[0]
                if any(row[d] is not None and (r, d) not in self.end for d in self.deps[i]):
                    continue
                queue.popleft()
                self.busy.add((r, stream))
                self._ready(r, i, t)

    def _ready(self, r: int, i: int, t: float) -> None:
        """Op i is next on its stream of rank r and its deps are done at time t."""
        op, d = self.ops[i], self.rows[r][i]
        assert d is not None
        if op.kind in (SEND, RECV):
            self._p2p(r, i, t, d)
        elif op.is_collective and not self.solo:
            group = tuple(self.group_of(op, r))
            outside = [m for m in group if m not in self.rows]
            if r not in group or outside:
                raise SimulationError(
                    f"collective {op.name!r} on rank {r}: group {group} must contain rank {r} "
                    f"and only simulated ranks",
                    op=op.name,
                )
            waiting = self.arrived.setdefault((i, group), [])
            waiting.append(r)
            if len(set(waiting)) == len(set(group)):
                del self.arrived[(i, group)]
                end = t + max(self.rows[m][i] or 0.0 for m in group)
                for m in group:
                    self._begin(m, i, t, end)
        else:
            self._begin(r, i, t, t + d)

    def _p2p(self, r: int, i: int, t: float, d: float) -> None:
        """Start a send (eager: ends at t + d) or a recv (ends once its send is known)."""
        op = self.ops[i]
        peer = peer_of(op, r)
        assert peer is not None
        tag = str(op.attrs.get("tag", ""))
        src, dst = (r, peer) if op.kind == SEND else (peer, r)
        key = (-1, -1, tag) if self.solo else (src, dst, tag)
        if op.kind == SEND:
            self._begin(r, i, t, t + d)
            if self.recvs.get(key):
                rr, ri, rt = self.recvs[key].popleft()
                self._push(rr, ri, max(rt + (self.rows[rr][ri] or 0.0), t + d))
            else:
                self.sends.setdefault(key, deque()).append((t, d))
        else:
            self._begin(r, i, t, None)
            if self.sends.get(key):
                st, sd = self.sends[key].popleft()
                self._push(r, i, max(t + d, st + sd))
            else:
                self.recvs.setdefault(key, deque()).append((r, i, t))

    def _begin(self, r: int, i: int, t: float, end: float | None) -> None:
        self.start[(r, i)] = t
        if self.comm[i]:
            self.active[r] += 1
            if self.active[r] == 1:
                self._rerate(r, t)
        elif self.slowdown > 0:
            assert end is not None
            self.slowed[r].append(_Slowed(i, end - t, t, 1.0))
            self._rerate(r, t)
            return
        if end is not None:
            self._push(r, i, end)

    def _finish(self, r: int, i: int, t: float) -> None:
        self.end[(r, i)] = t
        self.busy.discard((r, self.ops[i].stream))
        if self.comm[i]:
            self.active[r] -= 1
            if self.active[r] == 0:
                self._rerate(r, t)
        elif self.slowdown > 0:
            self.slowed[r] = [s for s in self.slowed[r] if s.index != i]

    def _rerate(self, r: int, t: float) -> None:
        """Comm activity on rank r changed at t: re-time its running compute ops."""
        factor = 1.0 + self.slowdown if self.active[r] else 1.0
        for s in self.slowed[r]:
            s.work = max(0.0, s.work - (t - s.since) / s.factor)
            s.since, s.factor = t, factor
            self._push(r, s.index, t + s.work * factor)

    def _push(self, r: int, i: int, end: float) -> None:
        version = self.version.get((r, i), 0) + 1
        self.version[(r, i)] = version
        self.tick += 1
        heapq.heappush(self.heap, (end, self.tick, r, i, version))

    def _check_finished(self) -> None:
        stuck: list[str] = []
        for (i, group), waiting in self.arrived.items():
            missing = sorted(set(group) - set(waiting))
            stuck.append(f"collective {self.ops[i].name!r} waits for ranks {missing}")
        for pending in self.recvs.values():
            for r, i, _ in pending:
                op = self.ops[i]
                stuck.append(
                    f"recv {op.name!r} on rank {r} has no matching send from rank "
                    f"{peer_of(op, r)} (tag {op.attrs.get('tag', '')!r})"
                )
        for r, queues in self.queues.items():
            for waiting_ops in queues.values():
                if waiting_ops:
                    name = self.ops[waiting_ops[0]].name
                    stuck.append(f"op {name!r} on rank {r} never became ready")
        if stuck:
            raise SimulationError(
                f"the program cannot finish: {'; '.join(stuck[:5])}", stuck=stuck[:20]
            )


def _events(ops: Sequence[DistOp], schedule: Schedule) -> list[Event]:
    """Events of one rank in start order, with each comm op's exposed seconds."""
    compute = _union([(s, e) for i, s, e in schedule if ops[i].stream == COMPUTE])
    compute_ends = [e for _, e in compute]
    out: list[Event] = []
    for i, start, end in sorted(schedule, key=lambda x: (x[1], x[0])):
        op = ops[i]
        comm = op.stream != COMPUTE
        nbytes = op.comm.bytes_per_rank if op.comm else float(op.attrs.get("bytes", 0.0))
        exposed = 0.0
        if comm:  # the compute intervals it overlaps start at the first that ends after it
            first = bisect.bisect_right(compute_ends, start)
            exposed = (end - start) - _overlap([(start, end)], compute, first)
        out.append(
            Event(
                op.name,
                op.kind,
                op.stream,
                op.role.value,
                op.scope,
                start,
                end,
                nbytes if comm else 0.0,
                max(exposed, 0.0),
            )
        )
    return out


def _union(intervals: Sequence[Interval]) -> list[Interval]:
    """Sorted disjoint intervals covering the same time."""
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _measure(intervals: Sequence[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def _overlap(a: Sequence[Interval], b: Sequence[Interval], j: int = 0) -> float:
    """Length of the intersection of two sorted disjoint interval lists (`b` from index `j`:
    none before it can meet `a`)."""
    total = 0.0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            total += min(end, b[k][1]) - max(start, b[k][0])
            k += 1
    return total
