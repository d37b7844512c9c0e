"""The reference of a sharded checkpoint (numpy): what each rank holds and writes under a layout,
how a checkpoint saved under one layout is loaded under another, and its bytes.

A *layout* of a model's tensors over ``world_size`` ranks gives each tensor a shard dimension
(``dims[i]``), or ``None`` for a replicated tensor:

* ``replicated`` (DDP): every tensor whole on every rank; a checkpoint writes it once
  (torch.distributed.checkpoint removes duplicates of a replicated tensor, ``dedup_save_plans``);
* ``fsdp`` (FSDP2's ``fully_shard``): every tensor split along dim 0;
* ``tp`` (DTensor ``Shard(d)``): each tensor along its own dimension (a column-parallel weight along 0,
  a row-parallel weight along 1, a row-parallel bias replicated);
* ``fsdp_tp`` (the 2-D composition, :data:`LAYOUTS_2D`): tensor parallelism of degree :data:`TP_2D` on the
  ``tp`` axis of a ``(dp, tp)`` DeviceMesh, ``dims[i]`` its dimension, then FSDP2 on the ``dp`` axis along
  dim 0 of each rank's tp shard (torch's placements ``(Shard(0), Shard(d))``, ``(Shard(0), Replicate())``,
  and ``(_StridedShard(0, sf=tp), Shard(0))`` when both split dim 0). Rank r is mesh coordinate
  ``(r // tp, r % tp)`` (DeviceMesh's row-major ``arange(N).view(dp, tp)``); it needs ``dp >= 2``, so 4 ranks
  or more (:func:`layouts_at`). The numpy save/load below model the one-axis layouts; :func:`shard_boxes`
  gives every layout's shards, the 2-D one included.

Rank r's shard is torch.chunk's: with c = ceil(n / N), rows ``[min(r c, n), min((r + 1) c, n))``, so
shards are uneven when N does not divide n, and the last ranks may hold nothing (DTensor's ``Shard`` and
FSDP2 split the same way; Zhao et al. 2023, "PyTorch FSDP", §3.2.1; torch.distributed.tensor docs).

A :class:`Checkpoint` is what torch.distributed.checkpoint writes: per tensor its global shape and a list
of items, each a shard with its offsets in the global tensor (the metadata's ``ChunkStorageMetadata``),
plus Adam's step count. Loading under another layout reads, for each rank's shard, the overlap of every
saved item with it: resharding is a copy of bits, so the round trip is bitwise for any dtype.

Adam (Kingma and Ba 2015, "Adam", Algorithm 1; torch.optim.Adam) keeps two moments of each parameter's
shape (``exp_avg``, ``exp_avg_sq``) and one step count per parameter tensor (a scalar: 4 bytes, float32,
in torch). Its update is elementwise, so one step on a rank's shard equals that shard of the step on the
whole tensor, bit for bit, provided the step count is the same: the bias corrections ``1 - beta^t`` depend
on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod

import numpy as np

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_positive_int
from distcheck.parallel.zero.reference import fsdp2_shard_rows

__all__ = [
    "LAYOUTS", "MOMENTS", "STEP_BYTES", "Checkpoint", "Loaded", "layout_dims", "shard_bounds", "shard",
    "save", "load", "assemble", "adam_step", "checkpoint_bytes", "data_bytes",
    "LAYOUTS_2D", "TP_2D", "layouts_at", "mesh_2d", "shard_boxes",
]

#: the layouts a checkpoint is saved or loaded under (module doc)
LAYOUTS = ("replicated", "fsdp", "tp")
#: the 2-D layouts (module doc): FSDP2 over tensor parallelism on a (dp, tp) DeviceMesh
LAYOUTS_2D = ("fsdp_tp",)
#: the tp degree of a 2-D layout over N ranks: its mesh is (N / TP_2D, TP_2D)
TP_2D = 2
#: Adam's per-element state, torch's names (torch.optim.Adam)
MOMENTS = ("exp_avg", "exp_avg_sq")
#: bytes of Adam's step count per parameter tensor in torch (a float32 scalar tensor)
STEP_BYTES = 4


@dataclass(frozen=True)
class Checkpoint:
    """A saved checkpoint: ``shapes`` (tensor name -> global shape), ``items`` (tensor name -> list of
    ``(offsets, array)``, each shard written once, offsets its first index along every dimension),
    ``step`` (Adam's step count, or None without optimizer state) and ``writers`` (tensor name -> the ranks
    that wrote its items, in order)."""

    shapes: Mapping[str, tuple[int, ...]]
    items: Mapping[str, list[tuple[tuple[int, ...], np.ndarray]]]
    step: int | None
    writers: Mapping[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Loaded:
    """What a load gives: ``shards`` (one dict per rank, tensor name -> that rank's shard) and ``step``."""

    shards: list[dict[str, np.ndarray]]
    step: int | None


def layout_dims(kind: str, shapes: Sequence[Sequence[int]], tp_dims: Sequence[int | None] | None = None
                ) -> tuple[int | None, ...]:
    """The shard dimension of each tensor under layout ``kind`` (one of :data:`LAYOUTS`): None for
    ``replicated``, 0 for ``fsdp``, ``tp_dims`` (one per tensor, each None or below its rank) for ``tp``.

    ``fsdp_tp`` (2-D) takes ``tp_dims`` as ``tp`` does: FSDP2's dim 0 is implied by the layout.

    Raises ConfigError for an unknown layout or a ``tp_dims`` that does not fit the shapes."""
    if kind not in LAYOUTS + LAYOUTS_2D:
        raise ConfigError("layout", kind, f"must be one of {list(LAYOUTS + LAYOUTS_2D)}")
    if kind == "replicated":
        return (None,) * len(shapes)
    if kind == "fsdp":
        return (0,) * len(shapes)
    dims = tuple(tp_dims) if tp_dims is not None else (0,) * len(shapes)
    if len(dims) != len(shapes) or any(d is not None and not 0 <= d < len(s) for d, s in zip(dims, shapes,
                                                                                              strict=False)):
        raise ConfigError("tp_dims", tp_dims, f"must give each of the {len(shapes)} tensors None or a dimension "
                                              "of its shape")
    return dims


def shard_bounds(n: int, world_size: int) -> list[tuple[int, int]]:
    """Rank r's rows ``(lo, hi)`` of ``n`` split over ``world_size`` ranks as torch.chunk does (module doc).

    Raises ConfigError for a negative ``n`` or a ``world_size`` below 1."""
    check_positive_int("world_size", world_size)
    if n == 0:
        return [(0, 0)] * world_size
    rows = fsdp2_shard_rows(n, world_size)
    out, lo = [], 0
    for k in rows:
        out.append((lo, lo + k))
        lo += k
    return out


def mesh_2d(world_size: int) -> tuple[int, int]:
    """The ``(dp, tp)`` mesh of a 2-D layout over ``world_size`` ranks: ``(world_size / TP_2D, TP_2D)``.

    Raises ConfigError unless :data:`TP_2D` divides ``world_size`` and ``dp >= 2``."""
    check_positive_int("world_size", world_size)
    if world_size % TP_2D or world_size // TP_2D < 2:
        raise ConfigError("world_size", world_size, f"a 2-D (dp, tp={TP_2D}) mesh needs a multiple of {TP_2D} "
                                                    f"with dp >= 2 ({2 * TP_2D} ranks or more)")
    return world_size // TP_2D, TP_2D


def layouts_at(world_size: int) -> tuple[str, ...]:
    """The layouts of ``world_size`` ranks: :data:`LAYOUTS`, and :data:`LAYOUTS_2D` where :func:`mesh_2d`
    has a mesh (4, 8, ... ranks). Raises ConfigError for a world size below 1."""
    check_positive_int("world_size", world_size)
    two_d = world_size % TP_2D == 0 and world_size // TP_2D >= 2
    return LAYOUTS + (LAYOUTS_2D if two_d else ())


Box = tuple[tuple[int, int], ...]


def shard_boxes(shape: Sequence[int], kind: str, dim: int | None, world_size: int) -> list[Box]:
    """Each rank's shard of a tensor of ``shape`` under layout ``kind`` (``dim``: its shard dimension, the tp
    dimension for ``fsdp_tp``) over ``world_size`` ranks, as a box: ``(lo, hi)`` along every dimension.
    The distinct non-empty boxes are the items a checkpoint writes (a replicated copy once).

    Raises ConfigError for an unknown layout, a ``dim`` outside the shape or a world the layout cannot
    take (:func:`mesh_2d`)."""
    layout_dims(kind, [shape], [dim])
    whole = [(0, n) for n in shape]
    if kind == "replicated" or (kind == "tp" and dim is None):
        return [tuple(whole)] * world_size
    if kind in ("fsdp", "tp"):
        d = dim if kind == "tp" and dim is not None else 0
        return [tuple(b if k == d else whole[k] for k in range(len(shape)))
                for b in shard_bounds(shape[d], world_size)]
    dp, tp = mesh_2d(world_size)
    out = []
    for r in range(world_size):
        box = list(whole)
        if dim is not None:
            box[dim] = shard_bounds(shape[dim], tp)[r % tp]
        lo, hi = box[0]
        a, b = shard_bounds(hi - lo, dp)[r // tp]
        box[0] = (lo + a, lo + b)
        out.append(tuple(box))
    return out


def shard(array: np.ndarray, dim: int | None, world_size: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s shard of ``array`` along ``dim`` (the whole array when ``dim`` is None)."""
    if dim is None:
        return array
    lo, hi = shard_bounds(array.shape[dim], world_size)[rank]
    return np.take(array, range(lo, hi), axis=dim)


def save(state: Mapping[str, np.ndarray], dims: Sequence[int | None], world_size: int,
         step: int | None = None) -> Checkpoint:
    """The checkpoint of ``state`` (name -> global array, ``dims`` in its order) held under a layout over
    ``world_size`` ranks: one item per non-empty shard, a replicated tensor's once, by rank 0."""
    shapes, items, writers = {}, {}, {}
    for (name, array), dim in zip(state.items(), dims, strict=True):
        shapes[name] = tuple(array.shape)
        if dim is None:
            items[name], writers[name] = [((0,) * array.ndim, array.copy())], [0]
            continue
        items[name], writers[name] = [], []
        for r, (lo, hi) in enumerate(shard_bounds(array.shape[dim], world_size)):
            if hi > lo:
                offsets = tuple(lo if d == dim else 0 for d in range(array.ndim))
                items[name].append((offsets, shard(array, dim, world_size, r).copy()))
                writers[name].append(r)
    return Checkpoint(shapes, items, step, writers)


def load(checkpoint: Checkpoint, dims: Sequence[int | None], world_size: int) -> Loaded:
    """Load ``checkpoint`` under a layout (``dims`` in the checkpoint's tensor order) over ``world_size``
    ranks: each rank's shard filled from the overlap of every saved item with it, by the items' offsets.

    Raises ConfigError when a shard is not covered entirely by the saved items."""
    shards: list[dict[str, np.ndarray]] = [{} for _ in range(world_size)]
    for (name, shape), dim in zip(checkpoint.shapes.items(), dims, strict=True):
        for r in range(world_size):
            want = [(0, n) for n in shape]
            if dim is not None:
                want[dim] = shard_bounds(shape[dim], world_size)[r]
            dtype = checkpoint.items[name][0][1].dtype
            out = np.zeros([b - a for a, b in want], dtype=dtype)
            filled = np.zeros(out.shape, dtype=bool)
            for offsets, item in checkpoint.items[name]:
                src, dst = [], []
                for (a, b), o, n in zip(want, offsets, item.shape, strict=True):
                    s, e = max(a, o), min(b, o + n)
                    if e <= s:
                        break
                    src.append(slice(s - o, e - o))
                    dst.append(slice(s - a, e - a))
                else:
                    out[tuple(dst)] = item[tuple(src)]
                    filled[tuple(dst)] = True
            if not filled.all():
                raise ConfigError("checkpoint", name, f"does not cover rank {r}'s shard {want}")
            shards[r][name] = out
    return Loaded(shards, checkpoint.step)


def assemble(shards: Sequence[Mapping[str, np.ndarray]], dims: Sequence[int | None],
             names: Sequence[str]) -> dict[str, np.ndarray]:
    """The global tensors from every rank's shards (a replicated tensor's from rank 0)."""
    out = {}
    for name, dim in zip(names, dims, strict=True):
        if dim is None:
            out[name] = shards[0][name]
        else:
            out[name] = np.concatenate([s[name] for s in shards], axis=dim)
    return out


def adam_step(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, step: int, *,
              lr: float = 2**-6, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """One Adam step (torch.optim.Adam's formula, elementwise): returns the new parameter, moments and
    step count ``step + 1``."""
    t = step + 1
    m = betas[0] * exp_avg + (1 - betas[0]) * grad
    v = betas[1] * exp_avg_sq + (1 - betas[1]) * grad * grad
    denom = np.sqrt(v) / np.sqrt(1 - betas[1] ** t) + eps
    return param - (lr / (1 - betas[0] ** t)) * m / denom, m, v, t


def checkpoint_bytes(shapes: Sequence[Sequence[int]], dims: Sequence[int | None], world_size: int, *,
                     param_bytes: int = 4, moment_bytes: int = 0, step_bytes: int = 0
                     ) -> tuple[tuple[int, ...], int]:
    """Bytes of a checkpoint, ``(held per rank, written in total)``.

    Each parameter element costs ``param_bytes`` plus two moments of ``moment_bytes`` (0: no optimizer
    state), each tensor ``step_bytes`` (Adam's step count: :data:`STEP_BYTES`; 0 without optimizer state).
    A rank holds its shards and the whole replicated tensors and scalars; the checkpoint holds each element
    once, so the total is the same under every layout and world size: P (b + 2 m) + T s for P parameter
    elements in T tensors.

    Raises ConfigError for a world size below 1."""
    check_positive_int("world_size", world_size)
    per_element = param_bytes + 2 * moment_bytes
    held = [0] * world_size
    total = 0
    for shape, dim in zip(shapes, dims, strict=True):
        numel = prod(shape)
        total += numel * per_element + step_bytes
        for r in range(world_size):
            if dim is None:
                held[r] += numel * per_element
            else:
                lo, hi = shard_bounds(shape[dim], world_size)[r]
                held[r] += (hi - lo) * (numel // shape[dim] if shape[dim] else 0) * per_element
            held[r] += step_bytes
    return tuple(held), total


def data_bytes(checkpoint: Checkpoint) -> int:
    """The tensor bytes a checkpoint's items hold (the step count excluded)."""
    return sum(a.nbytes for items in checkpoint.items.values() for _, a in items)
