"""Placements of a tensor on a mesh: per mesh axis `Shard(dim)`, `Replicate()` or `Partial(op)`.

Text form: one token per mesh axis, `S(0)R`, `RS(1)`, `P(sum)S(0)`. Several mesh axes may
shard the same tensor dim; the left (lower-index) mesh axis is the outermost split. The per-dim
form (`("dp", None, "tp")`, as in PyTorch/JAX partition specs) converts both ways.

Uneven shards follow PyTorch DTensor's layout (`Shard._split_tensor`, `torch.chunk`): a dim
of size S that one mesh axis of n ranks shards is cut into n contiguous blocks of ceil(S/n)
elements each, except the tail ones, which are short or empty (10 over 4: 3, 3, 3, 1; 6
over 4: 2, 2, 2, 0; 4096 over 48: 47 blocks of 86 and one of 54). Several mesh axes sharding
a dim cut it in turn, the left axis first and each later axis chunking the block the earlier
ones left (as DTensor nests its shards; with even splits that is the flattened block index).
So an exported plan's ranks hold exactly the rows Shardlab simulated and priced. Empty blocks
are allowed where torch.chunk makes them (a bias of 8 sharded over 48 ranks);
`empty_blocks` / `check_no_empty_blocks` name them for the few ops that cannot run on one.
`local_shape` is the largest block (rank 0's, what memory and the cost model use);
`local_shape_on` and `index_ranges` are a given rank's (an empty block's range is
`[stop, stop)` of the block it was cut from).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from shardlab.errors import PlacementError
from shardlab.mesh import Mesh

PARTIAL_OPS = frozenset({"sum", "avg", "max", "min"})


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True, slots=True)
class Shard:
    """Split tensor dim `dim` across the ranks of one mesh axis (DTensor's `torch.chunk`
    blocks: ceil-sized, the tail ones short or empty)."""

    dim: int

    def __post_init__(self) -> None:
        if not _is_int(self.dim) or self.dim < 0:
            raise PlacementError(
                f"Shard dim must be a non-negative integer, got {self.dim!r} "
                "(negative dims are not allowed in placements)",
                dim=repr(self.dim),
            )

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True, slots=True)
class Replicate:
    """Every rank along the mesh axis holds the whole tensor."""

    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True, slots=True)
class Partial:
    """Every rank along the mesh axis holds a partial value; `op` combines them."""

    op: str = "sum"

    def __post_init__(self) -> None:
        if self.op not in PARTIAL_OPS:
            raise PlacementError(
                f"unknown Partial op {self.op!r}; expected one of {', '.join(sorted(PARTIAL_OPS))}",
                op=repr(self.op),
            )

    def __str__(self) -> str:
        return f"P({self.op})"


Placement = Shard | Replicate | Partial
#: One entry of the per-dim form: no mesh axis, one axis name, or several (outer first).
DimSpec = str | tuple[str, ...] | None

_TOKEN = re.compile(r"S\(([^)]*)\)|R|P(?:\(([^)]*)\)|(?!\())")
_BAD_TOKEN = re.compile(r"[A-Za-z]*(?:\([^)]*\)?)?")


def _axes_text(names: Sequence[str]) -> str:
    return f"({', '.join(names)})" if names else "(no axes)"


def _count_error(subject: str, count: int, mesh: Mesh | int) -> PlacementError:
    ndim = mesh if isinstance(mesh, int) else mesh.ndim
    axes = "" if isinstance(mesh, int) else f" {_axes_text(mesh.axis_names)}"
    noun = "placement" if count == 1 else "placements"
    return PlacementError(
        f"{subject} has {count} {noun} but the mesh has {ndim} "
        f"{'axis' if ndim == 1 else 'axes'}{axes}",
        placements=count,
        mesh_axes=ndim,
    )


def _token_error(text: str, token: str, pos: int, why: str) -> PlacementError:
    return PlacementError(
        f"bad token {token!r} at position {pos} in placements {text!r}: {why}",
        text=text,
        token=token,
        position=pos,
    )


def _parse_token(text: str, pos: int) -> tuple[Placement, int]:
    """The placement whose token starts at `pos`, and the position after it."""
    m = _TOKEN.match(text, pos)
    if m is None:
        bad = _BAD_TOKEN.match(text, pos)
        token = (bad.group(0) if bad else "") or text[pos]
        raise _token_error(text, token, pos, "expected S(<dim>), R or P(<op>)")
    token = m.group(0)
    if token == "R":
        return Replicate(), m.end()
    if token.startswith("S"):
        arg = m.group(1).strip()
        if not (arg.isascii() and arg.isdigit()):
            negative = re.fullmatch(r"-\s*\d+", arg)
            why = "negative dims are not allowed in placements" if negative else "bad dim"
            raise _token_error(text, token, pos, f"{why}; expected S(<non-negative int>)")
        return Shard(int(arg)), m.end()
    op = (m.group(2) if m.group(2) is not None else "sum").strip()
    if op not in PARTIAL_OPS:
        ops = ", ".join(sorted(PARTIAL_OPS))
        raise _token_error(text, token, pos, f"unknown Partial op {op!r}; expected one of {ops}")
    return Partial(op), m.end()


def parse_placements(text: str, mesh: Mesh | int | None = None) -> tuple[Placement, ...]:
    """Parse the text form (`S(0)R`, `P(sum)S(0)`); `mesh` (or its ndim) checks the count."""
    out: list[Placement] = []
    pos = 0
    while pos < len(text):
        if text[pos].isspace() or text[pos] == ",":
            pos += 1
            continue
        placement, pos = _parse_token(text, pos)
        out.append(placement)
    if mesh is None:
        if not out:
            raise PlacementError(f"empty placements {text!r}; expected e.g. 'S(0)R'", text=text)
    elif len(out) != (mesh if isinstance(mesh, int) else mesh.ndim):
        raise _count_error(repr(text), len(out), mesh)
    return tuple(out)


def format_placements(placements: Sequence[Placement]) -> str:
    """The text form of placements, e.g. `S(0)R`."""
    return "".join(str(p) for p in placements)


#: One tuple object per distinct placement tuple, shared by every DistSpec that has it.
_CANONICAL: dict[tuple[Placement, ...], tuple[Placement, ...]] = {}


@functools.lru_cache(maxsize=4096)
def _text_of(placements: tuple[Placement, ...]) -> str:
    """`format_placements`, cached: programs print the same few specs thousands of times."""
    return format_placements(placements)


def _check_count(placements: Sequence[Placement], mesh: Mesh) -> None:
    if len(placements) != mesh.ndim:
        raise _count_error(repr(format_placements(placements)), len(placements), mesh)


def _sharding(placements: Sequence[Placement]) -> dict[int, list[int]]:
    """Tensor dim -> indices of the mesh axes sharding it, outermost first."""
    out: dict[int, list[int]] = {}
    for k, p in enumerate(placements):
        if isinstance(p, Shard):
            out.setdefault(p.dim, []).append(k)
    return out


def placements_from_dims(
    dims: Sequence[str | Sequence[str] | None], mesh: Mesh, tensor_rank: int
) -> tuple[Placement, ...]:
    """Convert the per-dim form (`("dp", None, "tp")`) to per-mesh-axis placements."""
    if len(dims) != tensor_rank:
        raise PlacementError(
            f"per-dim spec {tuple(dims)!r} has {len(dims)} entries but the tensor has rank "
            f"{tensor_rank}",
            entries=len(dims),
            tensor_rank=tensor_rank,
        )
    out: list[Placement] = [Replicate()] * mesh.ndim
    used: dict[str, int] = {}
    for d, entry in enumerate(dims):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        indices: list[int] = []
        for name in names:
            if name not in mesh.axis_names:
                raise PlacementError(
                    f"unknown mesh axis {name!r} for dim {d} in per-dim spec {tuple(dims)!r}; "
                    f"the mesh has axes {_axes_text(mesh.axis_names)}",
                    axis=str(name),
                    dim=d,
                )
            if name in used:
                raise PlacementError(
                    f"mesh axis {name!r} is used twice in per-dim spec {tuple(dims)!r} "
                    f"(dims {used[name]} and {d})",
                    axis=name,
                )
            used[name] = d
            indices.append(mesh.axis_names.index(name))
        if indices != sorted(indices):
            ordered = tuple(mesh.axis_names[k] for k in sorted(indices))
            raise PlacementError(
                f"mesh axes {names!r} sharding dim {d} must be listed in mesh order "
                f"{ordered!r}: the left mesh axis is the outermost split",
                dim=d,
            )
        for k in indices:
            out[k] = Shard(d)
    return tuple(out)


def placements_to_dims(
    placements: Sequence[Placement], mesh: Mesh, tensor_rank: int
) -> tuple[DimSpec, ...]:
    """Convert per-mesh-axis placements to the per-dim form; Partial has no per-dim form."""
    _check_count(placements, mesh)
    for k, p in enumerate(placements):
        if isinstance(p, Partial):
            axis = mesh.axis_names[k]
            raise PlacementError(f"{p} on mesh axis {axis!r} has no per-dim form", axis=axis)
    _check_shard_dims(placements, mesh, tensor_rank, "tensor")
    sharding = _sharding(placements)
    out: list[DimSpec] = []
    for d in range(tensor_rank):
        names = tuple(mesh.axis_names[k] for k in sharding.get(d, []))
        out.append(None if not names else names[0] if len(names) == 1 else names)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class DistSpec:
    """How one value is laid out: a mesh and one placement per mesh axis."""

    mesh: Mesh
    placements: tuple[Placement, ...]
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        placements = tuple(self.placements)
        for p in placements:
            if not isinstance(p, Shard | Replicate | Partial):
                raise PlacementError(f"{p!r} is not a placement", placement=repr(p))
        _check_count(placements, self.mesh)
        object.__setattr__(self, "placements", _CANONICAL.setdefault(placements, placements))
        object.__setattr__(self, "_hash", hash((self.mesh, placements)))

    # Specs key many dicts (lowering, the reshard cache): hash once, and compare canonical
    # placement tuples by identity first, without touching the placements themselves.
    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, DistSpec):
            return NotImplemented
        return (
            self._hash == other._hash
            and self.placements == other.placements
            and self.mesh == other.mesh
        )

    @classmethod
    def parse(cls, text: str, mesh: Mesh) -> DistSpec:
        """A DistSpec from the text form of its placements."""
        return cls(mesh, parse_placements(text, mesh))

    @classmethod
    def replicated(cls, mesh: Mesh) -> DistSpec:
        """The fully replicated DistSpec on `mesh`."""
        return cls(mesh, (Replicate(),) * mesh.ndim)

    def __str__(self) -> str:
        return _text_of(self.placements)

    def is_replicated(self) -> bool:
        """True when every mesh axis replicates the value."""
        return all(isinstance(p, Replicate) for p in self.placements)

    def has_partial(self) -> bool:
        """True when some mesh axis holds partial values."""
        return any(isinstance(p, Partial) for p in self.placements)

    def sharded_dims(self) -> dict[int, list[str]]:
        """Tensor dim -> names of the mesh axes sharding it, outermost first."""
        return {
            d: [self.mesh.axis_names[k] for k in axes]
            for d, axes in sorted(_sharding(self.placements).items())
        }


def _check_shard_dims(
    placements: Sequence[Placement], mesh: Mesh, tensor_rank: int, what: str
) -> None:
    for k, p in enumerate(placements):
        if isinstance(p, Shard) and not 0 <= p.dim < tensor_rank:
            valid = f"valid dims 0..{tensor_rank - 1}" if tensor_rank else "it has no dims"
            why = "negative dims are not allowed in placements" if p.dim < 0 else valid
            raise PlacementError(
                f"{p} on mesh axis {mesh.axis_names[k]!r} is out of range for {what!r} of rank "
                f"{tensor_rank} ({why})",
                axis=mesh.axis_names[k],
                dim=p.dim,
            )


def split_sizes(size: int, parts: int) -> tuple[int, ...]:
    """Block sizes of a dim of `size` cut into `parts` as DTensor cuts it (`torch.chunk`,
    missing chunks padded empty): ceil(size/parts) each, the tail ones short or empty."""
    chunk = -(-size // parts)
    return tuple(max(0, min(chunk, size - c * chunk)) for c in range(parts))


def _split_range(start: int, size: int, parts: int, c: int) -> tuple[int, int]:
    """`[start, stop)` of block `c` of `parts` of the run `[start, start + size)`, cut as
    `torch.chunk` cuts it (an empty tail block is `[start + size, start + size)`)."""
    chunk = -(-size // parts)
    return start + min(c * chunk, size), start + min((c + 1) * chunk, size)


def check_placements(
    shape: Sequence[int], mesh: Mesh, placements: Sequence[Placement], what: str = "tensor"
) -> None:
    """Raise PlacementError unless `placements` fit a tensor of `shape` on `mesh`: counts and
    dims in range. Uneven and empty blocks are fine (DTensor's layout, `split_sizes`)."""
    _check_count(placements, mesh)
    for d, size in enumerate(shape):
        if not _is_int(size) or size < 0:
            raise PlacementError(f"dim {d} of {what!r} has invalid size {size!r}", dim=d)
    _check_shard_dims(placements, mesh, len(shape), what)


@dataclass(frozen=True, slots=True)
class EmptyBlocks:
    """A sharded dim that leaves some ranks an empty block: the dim, its size, the mesh
    axes sharding it (outermost first) and how many of their blocks are empty."""

    dim: int
    size: int
    axes: tuple[str, ...]
    sizes: tuple[int, ...]
    empty: int


def nested_split_sizes(size: int, counts: Sequence[int]) -> tuple[int, ...]:
    """Every block's size, in flattened block order, when a dim of `size` is chunked by the
    mesh axes of sizes `counts` in turn (the left axis first, as DTensor nests its shards)."""
    blocks = [size]
    for n in counts:
        blocks = [b for parent in blocks for b in split_sizes(parent, n)]
    return tuple(blocks)


def empty_blocks(
    shape: Sequence[int], mesh: Mesh, placements: Sequence[Placement]
) -> tuple[EmptyBlocks, ...]:
    """The sharded dims of non-zero size whose layout leaves some ranks an empty block
    (`torch.chunk` runs out of elements: 6 over 4, 3 over 4, 7 over (2, 3))."""
    out = []
    for d, axes in sorted(_sharding(placements).items()):
        size = shape[d]
        sizes = nested_split_sizes(size, [mesh.shape[k] for k in axes])
        empty = sum(1 for b in sizes if b == 0)
        if size and empty:
            names = tuple(mesh.axis_names[k] for k in axes)
            out.append(EmptyBlocks(d, size, names, sizes, empty))
    return tuple(out)


def _runs(sizes: Sequence[int]) -> str:
    """Block sizes in order, runs of one size written once with their count: `86 x47, 54`."""
    parts = []
    for size, run in itertools.groupby(sizes):
        count = sum(1 for _ in run)
        parts.append(f"{size} x{count}" if count > 1 else str(size))
    return ", ".join(parts)


def check_no_empty_blocks(
    shape: Sequence[int],
    mesh: Mesh,
    placements: Sequence[Placement],
    what: str,
    why: str,
) -> None:
    """Raise PlacementError naming the value, dim, size and mesh axes when the layout leaves
    some rank an empty block: for the few ops that cannot run on one (`why` says which)."""
    for e in empty_blocks(shape, mesh, placements):
        listed = ", ".join(f"{a} ({mesh.axis_size(a)})" for a in e.axes)
        raise PlacementError(
            f"cannot shard dim {e.dim} of {what!r} (size {e.size}) over mesh axes {listed}: "
            f"DTensor's blocks ({_runs(e.sizes)}) leave {e.empty} rank(s) with an empty "
            f"block, and {why}",
            dim=e.dim,
            size=e.size,
            axes=list(e.axes),
        )


def is_even(shape: Sequence[int], mesh: Mesh, placements: Sequence[Placement]) -> bool:
    """True when every sharded dim divides into equal blocks (no rank's block is smaller)."""
    return all(
        shape[d] % math.prod(mesh.shape[k] for k in axes) == 0
        for d, axes in _sharding(placements).items()
    )


#: local shapes already computed (and checked), by (global shape, mesh, placements): a
#: program asks for the same few value types tens of thousands of times
_LOCAL_SHAPES: dict[tuple[tuple[int, ...], Mesh, tuple[Placement, ...]], tuple[int, ...]] = {}
_LOCAL_SHAPES_MAX = 1 << 16


def local_shape(
    shape: Sequence[int], mesh: Mesh, placements: Sequence[Placement]
) -> tuple[int, ...]:
    """The shape of the largest block a rank holds, rank 0's (checked once per distinct
    value type): what memory, the cost model and a program's local types use."""
    key = (tuple(shape), mesh, tuple(placements))
    known = _LOCAL_SHAPES.get(key)
    if known is not None:
        return known
    check_placements(shape, mesh, placements)
    out = list(shape)
    for d, axes in _sharding(placements).items():
        out[d] = -(-out[d] // math.prod(mesh.shape[k] for k in axes))
    if len(_LOCAL_SHAPES) >= _LOCAL_SHAPES_MAX:
        _LOCAL_SHAPES.clear()
    _LOCAL_SHAPES[key] = result = tuple(out)
    return result


def index_ranges(
    shape: Sequence[int], mesh: Mesh, placements: Sequence[Placement], rank: int
) -> tuple[tuple[int, int], ...]:
    """The global `[start, stop)` per tensor dim of the block `rank` holds."""
    local_shape(shape, mesh, placements)  # checks them (cached)
    coord = mesh.coord(rank)
    sharding = _sharding(placements)
    out: list[tuple[int, int]] = []
    for d, size in enumerate(shape):
        start, stop = 0, size
        for k in sharding.get(d, []):
            start, stop = _split_range(start, stop - start, mesh.shape[k], coord[k])
        out.append((start, stop))
    return tuple(out)


def local_shape_on(
    shape: Sequence[int], mesh: Mesh, placements: Sequence[Placement], rank: int
) -> tuple[int, ...]:
    """The shape of the block `rank` holds (smaller than `local_shape` on some ranks when a
    dim does not divide its mesh axes)."""
    return tuple(b - a for a, b in index_ranges(shape, mesh, placements, rank))


def group_sizes(
    shape: Sequence[int], mesh: Mesh, placements: Sequence[Placement], k: int, rank: int
) -> tuple[int, ...]:
    """Sizes along the dim mesh axis k shards (it must be the innermost axis sharding that
    dim) of the blocks held by `rank`'s group along axis k, in coordinate order: what a
    gather over axis k concatenates."""
    p = placements[k]
    if not isinstance(p, Shard):
        raise PlacementError(f"mesh axis {mesh.axis_names[k]!r} does not shard, it is {p}")
    parent = (*placements[:k], Replicate(), *placements[k + 1 :])
    start, stop = index_ranges(shape, mesh, parent, rank)[p.dim]
    return split_sizes(stop - start, mesh.shape[k])


def local_slices(
    shape: Sequence[int], mesh: Mesh, placements: Sequence[Placement], rank: int
) -> tuple[slice, ...]:
    """`index_ranges` as slices, to index the global numpy array with."""
    return tuple(slice(a, b) for a, b in index_ranges(shape, mesh, placements, rank))
