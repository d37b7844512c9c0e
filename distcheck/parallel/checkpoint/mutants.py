"""Mutants of checkpoint saving and loading: the silent bugs of resharding and of interrupted saves.

=================================  ==============================================  ===============================
mutant                             mistake                                         killed by
=================================  ==============================================  ===============================
checkpoint.equal_shards_loader     places saved item k at k * (n // items): right  checkpoint.reshard.bitwise
                                   only when the shards are equal                  (5 rows saved as 3 + 2)
checkpoint.step_not_restored       loads the tensors, leaves Adam's step count     checkpoint.reshard.step
                                   at a fresh optimizer's 0
checkpoint.tp_truncating_loader    rank r takes saved item r, cut or zero-padded   checkpoint.reshard.bitwise
                                   silently to its new shard (a load into another  (tp 4 -> 3 along dim 1)
                                   tp as if the layout had not changed)
checkpoint.replicated_per_rank     counts a replicated tensor once per rank in     checkpoint.bytes.closed_form
                                   the checkpoint's total (DDP written N times)
checkpoint.pointer_in_place        writes the last file, the LATEST pointer, in    checkpoint.atomic.swap
                                   place: a kill mid-write tears it                (kill at the pointer's bytes)
=================================  ==============================================  ===============================
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from distcheck.engine.mutants import mutant
from distcheck.parallel.checkpoint import reference as ref
from distcheck.parallel.checkpoint import swap
from distcheck.parallel.checkpoint.reference import Checkpoint, Loaded

__all__ = ["equal_shards_loader", "step_not_restored", "tp_truncating_loader", "replicated_per_rank",
           "pointer_in_place"]


def _saved_dim(shape: tuple[int, ...], items: list[tuple[tuple[int, ...], np.ndarray]]) -> int:
    for _, a in items:
        for d, (n, k) in enumerate(zip(shape, a.shape, strict=True)):
            if n != k:
                return d
    return 0


@mutant("checkpoint.equal_shards_loader", "checkpoint.reshard.bitwise")
def equal_shards_loader(checkpoint: Checkpoint, dims: Sequence[int | None], world_size: int) -> Loaded:
    """Rebuilds each tensor placing saved item k at k * (n // items) along the saved dimension, ignoring the
    items' offsets: the layout of equal shards, wrong (rows overwritten, rows left zero) for uneven ones."""
    full = {}
    for name, shape in checkpoint.shapes.items():
        items = checkpoint.items[name]
        d = _saved_dim(shape, items)
        out = np.zeros(shape, dtype=items[0][1].dtype)
        step = shape[d] // len(items)
        for k, (_, a) in enumerate(items):
            lo = min(k * step, shape[d])
            n = min(a.shape[d], shape[d] - lo)
            index = [slice(None)] * len(shape)
            index[d] = slice(lo, lo + n)
            src = [slice(None)] * len(shape)
            src[d] = slice(0, n)
            out[tuple(index)] = a[tuple(src)]
        full[name] = out
    return ref.load(ref.save(full, [None] * len(full), 1, checkpoint.step), dims, world_size)


@mutant("checkpoint.step_not_restored", "checkpoint.reshard.step")
def step_not_restored(checkpoint: Checkpoint, dims: Sequence[int | None], world_size: int) -> Loaded:
    """Loads every tensor right, and leaves Adam's step count at a fresh optimizer's 0."""
    return ref.Loaded(ref.load(checkpoint, dims, world_size).shards, 0)


@mutant("checkpoint.tp_truncating_loader", "checkpoint.reshard.bitwise")
def tp_truncating_loader(checkpoint: Checkpoint, dims: Sequence[int | None], world_size: int) -> Loaded:
    """Rank r copies saved item r (item 0 past the last) into its new shard, cut or zero-padded silently to
    the new shard's shape: what a loader that assumes the saving layout does in another tp."""
    right = ref.load(checkpoint, dims, world_size)
    shards = []
    for r, mine in enumerate(right.shards):
        out = {}
        for name, want in mine.items():
            items = checkpoint.items[name]
            a = items[r][1] if r < len(items) else items[0][1]
            got = np.zeros_like(want)
            cut = tuple(slice(0, min(x, y)) for x, y in zip(a.shape, want.shape, strict=True))
            got[cut] = a[cut]
            out[name] = got
        shards.append(out)
    return ref.Loaded(shards, right.step)


@mutant("checkpoint.replicated_per_rank", "checkpoint.bytes.closed_form")
def replicated_per_rank(shapes: Sequence[Sequence[int]], dims: Sequence[int | None], world_size: int, *,
                        param_bytes: int = 4, moment_bytes: int = 0, step_bytes: int = 0
                        ) -> tuple[tuple[int, ...], int]:
    """Counts a replicated tensor once per rank in the total, as if every DDP rank wrote its own copy."""
    per, total = ref.checkpoint_bytes(shapes, dims, world_size, param_bytes=param_bytes,
                                      moment_bytes=moment_bytes, step_bytes=step_bytes)
    extra = sum(int(np.prod(s)) * (param_bytes + 2 * moment_bytes) for s, d in zip(shapes, dims, strict=True)
                if d is None)
    return per, total + (world_size - 1) * extra


@mutant("checkpoint.pointer_in_place", "checkpoint.atomic.swap")
def pointer_in_place(root: str | os.PathLike[str], files: Mapping[str, bytes], *, name: str,
                     hook: Callable[[int], None] | None = None) -> Path:
    """:func:`~distcheck.parallel.checkpoint.swap.save_swap` with its last file, the pointer, written in
    place (truncated, then written in chunks) instead of to a temporary file renamed over it."""
    root = Path(root)
    staged = swap.save_swap(root / ".mutant", files, name=name)
    os.rename(staged, root / name)
    (root / swap.POINTER).write_bytes(b"")  # truncated in place: the old name is gone from here on
    if hook is not None:
        hook(0)
    swap.write_chunks(root / swap.POINTER, name.encode(), 0, hook, 1)
    return root / name
