"""Every rank's record of a step shipped once: a value that a lower rank holds bitwise travels as a reference to
that rank (:class:`Same`) instead of a second copy (numpy and hashlib only; the collective that agrees on it,
:func:`ship_once`, imports torch inside).

After a step every rank holds each parameter and AdamW moment as a full float64 array (a DTensor's
``full_tensor()``), so under FSDP2 and tensor parallelism every rank holds the same arrays: a training step of a
6 M-parameter model at 4 ranks would move four copies of every parameter and both moments to rank 0 (which runs
the reference) and again to the parent (which checks them). A DTensor without a replicated dim (FSDP2's and
tensor parallelism's shards) gives every rank of its mesh the same ``full_tensor()`` by construction (an
all-gather, or an all-reduce for a partial sum): the ranks above the mesh's lowest ship ``Same(lowest)`` for it
(the harness says which arrays are such, a step's ``gathered``). Every other array (a plain tensor, a DTensor
with a replicated dim, whose copies may drift apart) is hashed (SHA-256 of the bytes with the shape and dtype),
the ranks exchange the digests (``all_gather_object``, 32 bytes a value), and a rank ships it only when no lower
rank has the same digest; otherwise it ships ``Same(rank)``, the lowest such rank. :func:`restore` puts the arrays
back (the same object on every rank that shares it), so the check sees what each rank held: a replica that drifted
(a gradient never all-reduced) has its own digest and travels as itself.
Two different arrays with one SHA-256 digest would be taken as one; no such pair of arrays is known.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Same", "digests", "dedupe", "ship_once", "restore", "gather_to_rank0"]


@dataclass(frozen=True)
class Same:
    """The value is bitwise the one rank ``rank`` ships under the same step, name and kind."""

    rank: int


def _digest(value: Any) -> bytes | None:
    if value is None:
        return None
    a = np.ascontiguousarray(value)
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.data.cast("B"))
    return h.digest()


def _entries(steps: list[dict]) -> dict[tuple, Any]:
    """``(step, "params" | "state", name, moment)`` -> the array (moment 0 for a parameter)."""
    out: dict[tuple, Any] = {}
    for s, st in enumerate(steps):
        for name, value in st["params"].items():
            out[(s, "params", name, 0)] = value
        for name, moments in st["state"].items():
            for j, value in enumerate(moments):
                out[(s, "state", name, j)] = value
    return out


def _gathered(steps: list[dict]) -> dict[tuple, int]:
    """``(step, kind, name, moment)`` -> the lowest rank holding the same array by construction (each step's
    ``gathered``, keyed without the step)."""
    return {(s, *k): r for s, st in enumerate(steps) for k, r in st.get("gathered", {}).items()}


def digests(steps: list[dict]) -> dict[tuple, bytes]:
    """The SHA-256 digest of every array of a rank's ``steps`` (:func:`_entries`' keys), None values and the
    arrays held by construction (a step's ``gathered``) left out."""
    known = _gathered(steps)
    return {k: d for k, v in _entries(steps).items() if k not in known and (d := _digest(v)) is not None}


def _replaced(steps: list[dict], same: dict[tuple, Any]) -> list[dict]:
    out = []
    for s, st in enumerate(steps):
        params = {n: same.get((s, "params", n, 0), v) for n, v in st["params"].items()}
        state = {n: tuple(same.get((s, "state", n, j), v) for j, v in enumerate(m)) for n, m in st["state"].items()}
        out.append({k: v for k, v in dict(st, params=params, state=state).items() if k != "gathered"})
    return out


def dedupe(steps: list[dict], rank: int, every: list[dict[tuple, bytes]]) -> list[dict]:
    """``steps`` (rank ``rank``'s) with each array whose digest a lower rank also has (``every[r]``: rank r's
    :func:`digests`) replaced by ``Same`` of the lowest such rank, and each array a step's ``gathered`` names a
    lower rank for (a DTensor's ``full_tensor()`` over a mesh without a replicated dim: the same on every rank of
    the mesh by construction, never hashed) by ``Same`` of that rank. A new list, without ``gathered``."""
    mine = every[rank]
    same: dict[tuple, Same] = {k: Same(r) for k, r in _gathered(steps).items() if r < rank}
    for key, d in mine.items():
        for r in range(rank):
            if every[r].get(key) == d:
                same[key] = Same(r)
                break
    return _replaced(steps, same)


def ship_once(steps: list[dict]) -> list[dict]:
    """This rank's ``steps`` as it ships them (:func:`dedupe` against every rank's digests, exchanged with
    ``torch.distributed.all_gather_object`` over the default group: every rank must call it). Without a process
    group of more than one rank, ``steps`` itself."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return steps
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, digests(steps))
    return dedupe(steps, dist.get_rank(), every)


def _lookup(records: list[dict], key: tuple, rank: int) -> Any:
    s, kind, name, j = key
    st = records[rank]["steps"][s]
    value = st["params"].get(name) if kind == "params" else st["state"].get(name, (None, None))[j]
    if isinstance(value, Same):
        raise ValueError(f"rank {rank}'s {kind} {name!r} of step {s + 1} refers to rank {value.rank}: a shipped "
                         "value refers only to a rank that holds it")
    return value


def restore(records: list[dict]) -> list[dict]:
    """Every rank's record (a dict with ``steps``) with each ``Same(r)`` replaced by rank r's array (the same
    object); records without one are returned as they are. A new list; ``records`` is not changed. ValueError
    when a ``Same`` names a rank that does not hold the value itself."""
    if not any(isinstance(v, Same) for rec in records for v in _entries(rec["steps"]).values()):
        return records
    out = []
    for rec in records:
        same = {k: v for k, v in _entries(rec["steps"]).items() if isinstance(v, Same)}
        found = {k: _lookup(records, k, v.rank) for k, v in same.items()}
        out.append(dict(rec, steps=_replaced(rec["steps"], found)) if found else rec)
    return out


def gather_to_rank0(ctx: Any, result: dict, keep: bool) -> list[dict] | None:
    """Every rank's record (``result``, a :func:`~distcheck.parallel.step.harness.run_step` result, but its
    ``trace``) gathered to rank 0 over the default group (every rank must call it; ``ctx`` the rank's context:
    ``rank``, ``world_size``), the arrays shipped once restored (:func:`restore`), also kept as rank 0's
    ``result["every"]`` when ``keep``; None on the other ranks. Only rank 0 reads them. Rank 0 keeps its own record
    rather than sending it (``gather_object`` pads every rank's bytes to the largest object's: rank 0's, which
    holds every array, would make each rank send that many bytes)."""
    import torch.distributed as dist

    records: list | None = [None] * ctx.world_size if ctx.rank == 0 else None
    own_record = {k: v for k, v in result.items() if k != "trace"}
    dist.gather_object(None if ctx.rank == 0 else own_record, records, dst=0)
    if records is None:
        return None
    records[0] = own_record
    records = restore(records)
    if keep:
        result["every"] = records
    return records
