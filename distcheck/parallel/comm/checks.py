"""Bytes per rank of real collectives on a real world, against ``comm.bytes_per_rank.*``: the
``comm.bytes_per_rank.<collective>`` rows of ``distcheck check``'s layers stage.

The property (:func:`ring_collective_rank`): each rank runs a ring all-reduce, all-gather or
reduce-scatter built from point-to-point ``isend``/``irecv`` on the real process group,
counting the bytes it hands to ``isend``; the result must equal torch's own collective
bitwise (inputs are integer-valued float64, so every partial sum is exact below 2**53), the
``S`` that :func:`~distcheck.engine.collectives.ByteCounter` measures on torch's call must be
the full-size S, and the counted bytes must equal ``comm.bytes_per_rank.<collective>(size_bytes=S,
n=world_size)`` exactly when ``n`` divides the element count; otherwise they must equal the
numpy ring of :mod:`distcheck.parallel.comm.reference` rank for rank (chunks follow
``array_split``).

Sizes are enumerated, not drawn: the only input that changes what a ring sends is the element
count modulo ``n`` (and whether it is below ``n``, leaving some ranks an empty chunk), so every
residue ``numel = 12 n + r`` (``r = 0 .. n-1``) and ``numel = 1`` are run
(:func:`default_collective_examples`), which covers every case a Hypothesis draw could reach.

gloo (and NCCL) have point-to-point; torch's threaded backend does not, so on ``threaded`` the
rows are ``skip`` with that reason. gloo cannot all-gather uneven shards; its reference there
is an all-reduce of zero-padded buffers, and the row says so.

Source of the closed forms: nccl-tests doc/PERFORMANCE.md (bus-bandwidth factors 2(n-1)/n,
(n-1)/n, (n-1)/n). torch is imported inside the functions only.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from distcheck.core.results import CheckResult
from distcheck.core.validate import check_choice, check_positive_int
from distcheck.core.vocab import Collective
from distcheck.engine.collectives import ByteCounter
from distcheck.engine.drivers import result_row, run_guarded, skip_row
from distcheck.engine.world import RankContext, World

if TYPE_CHECKING:
    import torch

__all__ = ["RING_COLLECTIVES", "UNEVEN_ALL_GATHER", "chunk_bounds", "ring_collective_rank",
           "default_collective_examples", "collective_rows", "world_rows", "skip_rows"]

#: the real-backend checks of this package join the layers stage of ``distcheck check``
STAGE = "layers"

#: collectives the ring property covers
RING_COLLECTIVES = (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER)

_BACKENDS_WITH_P2P = ("gloo", "nccl")
#: backends whose ``all_gather`` accepts shards of different sizes (gloo raises
#: "ProcessGroupGloo::allgather: invalid tensor size"; NCCL falls back to broadcasts)
UNEVEN_ALL_GATHER = ("nccl",)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def chunk_bounds(count: int, n: int) -> list[tuple[int, int]]:
    """numpy.array_split bounds: the first ``count % n`` chunks get one extra element."""
    q, r = divmod(count, n)
    out, start = [], 0
    for k in range(n):
        size = q + (1 if k < r else 0)
        out.append((start, start + size))
        start += size
    return out


def _ring_step(ctx: RankContext, send_t: torch.Tensor, recv_t: torch.Tensor, sent: list[int]) -> None:
    """Send ``send_t`` to rank+1 while receiving ``recv_t`` from rank-1 (counted)."""
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    ops = []
    if send_t.numel():
        ops.append(dist.P2POp(dist.isend, send_t.contiguous(), (r + 1) % n))
        sent[0] += _nbytes(send_t)
    if recv_t.numel():
        ops.append(dist.P2POp(dist.irecv, recv_t, (r - 1) % n))
    if ops:
        for w in dist.batch_isend_irecv(ops):
            w.wait()


def _ring_reduce_scatter(ctx: RankContext, buf: torch.Tensor, bounds: Sequence[tuple[int, int]], shift: int,
                         sent: list[int]) -> None:
    import torch

    n, r = ctx.world_size, ctx.rank
    for k in range(n - 1):
        s_lo, s_hi = bounds[(r - k - shift) % n]
        g_lo, g_hi = bounds[(r - k - 1 - shift) % n]
        incoming = torch.empty(g_hi - g_lo, dtype=buf.dtype, device=buf.device)
        _ring_step(ctx, buf[s_lo:s_hi], incoming, sent)
        buf[g_lo:g_hi] += incoming


def _ring_all_gather(ctx: RankContext, buf: torch.Tensor, bounds: Sequence[tuple[int, int]], shift: int,
                     sent: list[int]) -> None:
    import torch

    n, r = ctx.world_size, ctx.rank
    for k in range(n - 1):
        s_lo, s_hi = bounds[(r - k + shift) % n]
        g_lo, g_hi = bounds[(r - k - 1 + shift) % n]
        incoming = torch.empty(g_hi - g_lo, dtype=buf.dtype, device=buf.device)
        _ring_step(ctx, buf[s_lo:s_hi], incoming, sent)
        buf[g_lo:g_hi] = incoming


def _all_gather_single(out: torch.Tensor, inp: torch.Tensor) -> None:
    import torch.distributed as dist

    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp)


def _reduce_scatter_single(out: torch.Tensor, inp: torch.Tensor) -> None:
    import torch.distributed as dist

    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp)


def ring_collective_rank(ctx: RankContext, example: dict) -> dict:
    """Rank function: ring collective over point-to-point vs torch's collective.

    ``example``: ``{"collective": one of :data:`RING_COLLECTIVES`,
    "numel": int >= 1 (elements of the FULL tensor S), "seed": int}``.

    Returns a dict (plain Python): ``sent_bytes`` (bytes this rank handed to
    ``isend``), ``measured`` (the ``(collective, S)`` records :class:`ByteCounter`
    saw on torch's own call: the same collective when ``n`` divides ``numel``; for
    an uneven all-gather, NCCL's list-form ``all_gather``, but on gloo, which
    refuses uneven shards (see :data:`UNEVEN_ALL_GATHER`), an all-reduce of
    zero-padded buffers; for an uneven reduce-scatter, the list form), ``equal``
    (ring result bitwise equal to torch's) and ``max_error``.
    """
    import torch
    import torch.distributed as dist

    coll = check_choice("collective", example["collective"], RING_COLLECTIVES)
    numel = check_positive_int("numel", example["numel"])
    n, r = ctx.world_size, ctx.rank
    gen = torch.Generator().manual_seed(int(example.get("seed", 0)) * 7919 + r)
    full = torch.randint(-64, 65, (numel,), generator=gen).to(torch.float64).to(ctx.device)
    bounds = chunk_bounds(numel, n)
    sent = [0]
    counter = ByteCounter()
    if coll == Collective.ALL_REDUCE:
        ring = full.clone()
        _ring_reduce_scatter(ctx, ring, bounds, 0, sent)
        _ring_all_gather(ctx, ring, bounds, 1, sent)
        ours = ring
        ref = full.clone()
        with counter:
            dist.all_reduce(ref)
    elif coll == Collective.REDUCE_SCATTER:
        ring = full.clone()
        # shift 1: after n-1 steps rank r holds the sum of chunk r
        _ring_reduce_scatter(ctx, ring, bounds, 1, sent)
        lo, hi = bounds[r]
        ours = ring[lo:hi]
        if numel % n == 0:
            ref = torch.empty(numel // n, dtype=full.dtype, device=full.device)
            with counter:
                _reduce_scatter_single(ref, full)
        else:  # torch's reduce_scatter_tensor needs equal chunks: reduce_scatter over lists
            ins = [full[a:b].clone() for a, b in bounds]
            ref = torch.empty(hi - lo, dtype=full.dtype, device=full.device)
            with counter:
                dist.reduce_scatter(ref, ins)
    else:  # all_gather: rank r contributes chunk r of a full buffer
        lo, hi = bounds[r]
        ring = torch.zeros(numel, dtype=full.dtype, device=full.device)
        ring[lo:hi] = full[lo:hi]
        _ring_all_gather(ctx, ring, bounds, 0, sent)
        ours = ring
        if numel % n == 0:
            ref = torch.empty(numel, dtype=full.dtype, device=full.device)
            with counter:
                _all_gather_single(ref, full[lo:hi].contiguous())
        elif ctx.backend in UNEVEN_ALL_GATHER:  # NCCL gathers uneven shards (list form)
            outs = [torch.empty(b - a, dtype=full.dtype, device=full.device) for a, b in bounds]
            with counter:
                dist.all_gather(outs, full[lo:hi].contiguous())
            ref = torch.cat(outs)
        else:  # gloo's all_gather needs equal shards: gather by summing zero-padded buffers
            ref = torch.zeros(numel, dtype=full.dtype, device=full.device)
            ref[lo:hi] = full[lo:hi]
            with counter:
                dist.all_reduce(ref)
    diff = (ours - ref).abs().max().item() if ours.numel() else 0.0
    return {
        "sent_bytes": sent[0],
        "measured": list(counter.records),
        "equal": bool(torch.equal(ours, ref)),
        "max_error": float(diff),
    }


def default_collective_examples(world_size: int) -> list[dict]:
    """Every residue of the element count modulo ``n`` (``numel = 12 n + r``, ``r = 0 .. n-1``) and
    ``numel = 1`` (ranks beyond the first hold an empty chunk), for each collective."""
    n = check_positive_int("world_size", world_size)
    sizes = [12 * n + r for r in range(n)] + ([1] if n > 1 else [])
    return [{"collective": coll, "numel": numel, "seed": i + 1}
            for coll in RING_COLLECTIVES for i, numel in enumerate(sizes)]


def _expected_bytes(coll: str, numel: int, n: int, itemsize: int = 8) -> tuple[list[int], Fraction]:
    """Per-rank bytes of the numpy ring (distcheck.parallel.comm) and the closed form for S = numel*itemsize."""
    import numpy as np

    from distcheck.engine.catalogue import get
    from distcheck.parallel.comm import reference as comm

    S = numel * itemsize
    form = Fraction(get(f"comm.bytes_per_rank.{coll}").evaluate(size_bytes=S, n=n))
    rng = np.random.default_rng(0)
    if coll == Collective.ALL_GATHER:
        shards = [rng.integers(-5, 5, size=b - a).astype(np.float64) for a, b in chunk_bounds(numel, n)]
        res = comm.ring_all_gather(shards)
    else:
        arrays = [rng.integers(-5, 5, size=numel).astype(np.float64) for _ in range(n)]
        res = comm.ring_all_reduce(arrays) if coll == Collective.ALL_REDUCE else comm.ring_reduce_scatter(arrays)
    return list(res.sent_bytes), form


def collective_rows(world: World, examples: Sequence[dict] | None = None) -> list[CheckResult]:
    """Measured bytes per rank of ring collectives against ``comm.bytes_per_rank.*``, on ``world``.

    One row per collective. A row passes when, for every example and rank: the ring result
    equals torch's collective bitwise; torch's call was measured at the full size S = numel * 8
    bytes; the bytes the rank sent equal ``comm.bytes_per_rank.<collective>(S, n)`` exactly
    (when ``n`` divides numel) and the numpy ring of :mod:`distcheck.parallel.comm.reference`
    rank for rank (always). ``threaded`` rows are ``skip`` (no point-to-point there).

    Args:
        world: a world (``run``, ``world_size``, ``backend``).
        examples: dicts as :func:`ring_collective_rank` takes; default
            :func:`default_collective_examples` (every residue of numel mod n).
    """
    ws, be = world.world_size, world.backend
    rows: list[CheckResult] = []
    for coll in RING_COLLECTIVES:
        check = f"comm.bytes_per_rank.{coll}"
        if be not in _BACKENDS_WITH_P2P:
            rows.append(skip_row(check, be, ws, f"backend {be!r} has no point-to-point send/recv; run on gloo or nccl"))
            continue
        exs = [e for e in (examples or default_collective_examples(ws)) if e["collective"] == coll]
        ok, worst, details, summary = True, 0.0, [], []
        for ex in exs:
            results, err = run_guarded(world, ring_collective_rank, ex)
            if err:
                ok = False
                details.append(err)
                break
            assert results is not None, "run_guarded returns results when it returns no error"
            expected_ring, form = _expected_bytes(coll, ex["numel"], ws)
            S = ex["numel"] * 8
            summary.append((ex, max(res["sent_bytes"] for res in results)))
            for rk, res in enumerate(results):
                worst = max(worst, res["max_error"])
                bad = []
                if not res["equal"]:
                    bad.append("ring result != torch collective")
                uneven_gloo = coll == Collective.ALL_GATHER and ex["numel"] % ws and be not in UNEVEN_ALL_GATHER
                kind = Collective.ALL_REDUCE if uneven_gloo else coll
                if res["measured"] != [(kind, S)]:
                    bad.append(f"torch's call measured {res['measured']}, expected [({kind!r}, {S})]")
                if res["sent_bytes"] != expected_ring[rk]:
                    bad.append(f"sent {res['sent_bytes']} B, numpy ring {expected_ring[rk]} B")
                if ex["numel"] % ws == 0 and Fraction(res["sent_bytes"]) != form:
                    bad.append(f"sent {res['sent_bytes']} B, closed form {form} B")
                if bad:
                    ok = False
                    details.append(f"numel={ex['numel']} rank {rk}: " + "; ".join(bad))
        even = [(e, sent) for e, sent in summary if e["numel"] % ws == 0]
        detail = details[0] if details else (
            "; ".join(f"S={e['numel'] * 8} B: {sent} B per rank" for e, sent in even)
            + f" (closed form); {len(exs)} sizes enumerated, every residue of numel mod {ws}"
            + (" and numel=1" if ws > 1 else "") + ": numpy ring rank for rank")
        if (not details and coll == Collective.ALL_GATHER and be not in UNEVEN_ALL_GATHER
                and any(e["numel"] % ws for e in exs)):
            detail += (f"; uneven all_gather unsupported on {be} (equal shards only): torch's reference there is "
                       "a zero-padded all_reduce; the nccl path runs the real uneven all_gather")
        rows.append(result_row(check, be, ws, len(exs), ok, max_error=worst, bound=0.0, detail=detail))
    return rows


def world_rows(world: World, *, timeout_s: float) -> list[CheckResult]:
    """The layers stage's rows of this package on one world (a pool's own timeout applies per step)."""
    return collective_rows(world)


def skip_rows(world_size: int, backend: str, reason: str) -> list[CheckResult]:
    """One ``skip`` row per collective for a world of ``world_size`` ranks that ``backend`` cannot run here."""
    return [skip_row(f"comm.bytes_per_rank.{coll}", backend, world_size, reason) for coll in RING_COLLECTIVES]
