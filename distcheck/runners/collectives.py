"""Bytes per rank of real collectives, against ``comm.bytes_per_rank.*``; and driver helpers.

Two tools live here, both used by the other layer runners:

* :class:`ByteCounter`, a ``TorchDispatchMode`` that records every collective
  that reaches the c10d dispatcher (``c10d::allreduce_``,
  ``c10d::_allgather_base_``, ``c10d::_reduce_scatter_base_``, their
  coalesced forms, and the functional collectives DTensor issues) with its
  full size ``S`` in bytes, in the nccl-tests convention of
  :mod:`distcheck.forms.comm`: the tensor every rank holds for all-reduce, the
  concatenated OUTPUT of all-gather, the full INPUT of reduce-scatter. Dispatch
  modes are per thread, so the counter works unchanged on the threaded backend,
  where the c10d calls of ``torch.distributed`` (which bypass the dispatcher
  there) are recorded from the threaded process group itself.
* the driver helpers (:func:`iter_pools`, :func:`result_row`) that turn rank
  results into :class:`~distcheck.report.CheckResult` rows.

The property (:func:`ring_collective_rank`): each rank runs a ring all-reduce,
all-gather or reduce-scatter built from point-to-point ``isend``/``irecv`` on
the real process group, counting the bytes it hands to ``isend``; the result
must equal torch's own collective bitwise (inputs are integer-valued float64,
so every partial sum is exact below 2**53), the ``S`` that :class:`ByteCounter`
measures on torch's call must be the full-size S, and the counted bytes must
equal ``comm.bytes_per_rank.<collective>(size_bytes=S, n=world_size)`` exactly
when ``n`` divides the element count; otherwise they must equal the numpy
ring of :mod:`distcheck.comm` rank for rank (chunks follow ``array_split``).

gloo (and NCCL) have point-to-point; torch's threaded backend does not, so on
``threaded`` the driver reports ``skip`` with that reason.

Source of the closed forms: nccl-tests doc/PERFORMANCE.md (bus-bandwidth
factors 2(n-1)/n, (n-1)/n, (n-1)/n).
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from fractions import Fraction
from typing import Any, Iterator, Sequence

from distcheck.errors import (
    BackendUnavailable,
    ConfigError,
    DistributedError,
    RankFailure,
    check_choice,
    check_positive_int,
)
from distcheck.report import FAIL, PASS, SKIP, CheckResult

__all__ = [
    "RING_COLLECTIVES",
    "UNEVEN_ALL_GATHER",
    "ByteCounter",
    "chunk_bounds",
    "is_world",
    "iter_pools",
    "result_row",
    "skip_row",
    "run_guarded",
    "describe_failure",
    "exception_line",
    "ring_collective_rank",
    "default_collective_examples",
    "run_collective_checks",
]

#: collectives the ring property covers
RING_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")

_BACKENDS_WITH_P2P = ("gloo", "nccl")
#: backends whose ``all_gather`` accepts shards of different sizes (gloo raises
#: "ProcessGroupGloo::allgather: invalid tensor size"; NCCL falls back to broadcasts)
UNEVEN_ALL_GATHER = ("nccl",)


# --------------------------------------------------------------------------- driver helpers


@contextmanager
def _pool_for(world_size: int, backend: str, timeout_s: float):
    from distcheck.runners.pool import RankPool

    with RankPool(world_size=world_size, backend=backend, timeout_s=timeout_s) as pool:
        yield pool


def is_world(obj) -> bool:
    """True for a started or unstarted world object: ``.run``, ``.world_size`` and ``.backend``.

    A :class:`~distcheck.runners.pool.RankPool`, a
    :class:`~distcheck.runners.torchrun.TorchrunWorld`, or any object with the
    same contract (``run(fn, *args)`` returns every rank's result).
    """
    return callable(getattr(obj, "run", None)) and hasattr(obj, "world_size") and hasattr(obj, "backend")


def iter_pools(pool_or_world_sizes, backend: str = "gloo", timeout_s: float = 60.0) -> Iterator[tuple[Any, int, str, str | None]]:
    """Yield ``(world, world_size, backend, skip_reason)`` for each world to check.

    ``pool_or_world_sizes`` is a world (see :func:`is_world`: a started or
    unstarted ``RankPool``, a ``TorchrunWorld``, ...) used as is with its own
    world size and backend, an int world size, or a sequence of them (a pool is
    opened per world size with ``backend`` and closed after its checks). When a
    backend cannot run here (e.g. NCCL without GPUs) the world is ``None`` and
    ``skip_reason`` says why; the caller emits ``skip`` rows.

    Raises:
        ConfigError: a world size that is not an int >= 1, or an empty sequence.
    """
    if is_world(pool_or_world_sizes):
        yield pool_or_world_sizes, pool_or_world_sizes.world_size, pool_or_world_sizes.backend, None
        return
    sizes = [pool_or_world_sizes] if isinstance(pool_or_world_sizes, int) else list(pool_or_world_sizes)
    if not sizes:
        raise ConfigError("pool_or_world_sizes", pool_or_world_sizes, "must name at least one world size")
    for ws in sizes:
        if is_world(ws):
            yield ws, ws.world_size, ws.backend, None
            continue
        check_positive_int("world_size", ws)
        try:
            cm = _pool_for(ws, backend, timeout_s)
            pool = cm.__enter__()
        except BackendUnavailable as exc:
            yield None, ws, backend, str(exc)
            continue
        try:
            yield pool, ws, backend, None
        finally:
            cm.__exit__(None, None, None)


def result_row(check: str, backend: str, world_size: int, examples: int, ok: bool, *,
               max_error: float | None = None, bound: float | None = None, detail: str = "",
               extra: dict | None = None) -> CheckResult:
    """A pass/FAIL :class:`CheckResult` row."""
    return CheckResult(check=check, backend=backend, verdict=PASS if ok else FAIL, world_size=world_size,
                       examples=examples, max_error=max_error, bound=bound, detail=detail, extra=extra or {})


def skip_row(check: str, backend: str, world_size: int, reason: str) -> CheckResult:
    """A ``skip`` row carrying the reason."""
    return CheckResult(check=check, backend=backend, verdict=SKIP, world_size=world_size, examples=0, detail=reason)


#: the longest detail :func:`describe_failure` returns, in characters
FAILURE_DETAIL_CHARS = 400

_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure|Timeout|Warning|Unavailable))(:.*)?$")


def exception_line(text: str) -> str:
    """The ``Type: message`` line of a traceback text; the first line when there is none.

    A Python traceback ends with the exception line; with a multi-line message
    the last line is only the message's tail, so the last line at column 0 that
    starts with an exception type name (``...Error``, ``...Exception``,
    ``KeyboardInterrupt``, ``SystemExit``, ...) is taken. A rank that died
    without a Python exception has no such line; its text starts with how it
    ended (``rank 1 was killed by SIGSEGV ...``), so the first non-empty line is
    returned then.
    """
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if _EXC_LINE.match(ln):
            return ln
    return lines[0].strip() if lines else ""


def describe_failure(exc: BaseException, limit: int = FAILURE_DETAIL_CHARS) -> str:
    """A one-line detail for a failed world step, at most ``limit`` characters.

    * :class:`~distcheck.errors.RankFailure`: ``RankFailure: rank r failed:
      <Type: message of rank r>`` for the first failing rank ``r`` (its own
      traceback's exception line, never the pool's trailing notes), then
      ``(also failed: ranks [...])`` when others failed too. When the line is
      too long the *other ranks* note goes first, then the message is cut, so
      the exception type always survives.
    * any other error: ``Type: first line`` (a ``WorldTimeout``'s first line
      names the timeout and the stuck ranks).
    """
    name = type(exc).__name__
    if isinstance(exc, RankFailure):
        failures = getattr(exc, "failures", None) or {exc.rank: exc.traceback_text}
        line = exception_line(failures.get(exc.rank, exc.traceback_text))
        head = f"{name}: rank {exc.rank} failed: "
        others = sorted(set(failures) - {exc.rank})
        note = f" (also failed: ranks {others})" if others else ""
        if len(head) + len(line) + len(note) > limit:
            note = ""
        text = head + line + note
    else:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        text = f"{name}: {lines[0] if lines else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_guarded(pool, fn, *args) -> tuple[list | None, str | None]:
    """``pool.run(fn, *args)``; a failing world becomes ``(None, describe_failure(error))``."""
    try:
        return pool.run(fn, *args), None
    except DistributedError as exc:
        return None, describe_failure(exc)


# --------------------------------------------------------------------------- byte counter

from distcheck.engine.collectives import ByteCounter  # noqa: E402  (moved to the engine layer)
from distcheck.engine.collectives import classify as _classify  # noqa: E402


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


# --------------------------------------------------------------------------- ring property


def chunk_bounds(count: int, n: int) -> list[tuple[int, int]]:
    """numpy.array_split bounds: the first ``count % n`` chunks get one extra element."""
    q, r = divmod(count, n)
    out, start = [], 0
    for k in range(n):
        size = q + (1 if k < r else 0)
        out.append((start, start + size))
        start += size
    return out


def _ring_step(ctx, send_t, recv_t, sent: list[int]) -> None:
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


def _ring_reduce_scatter(ctx, buf, bounds, shift: int, sent: list[int]) -> None:
    import torch

    n, r = ctx.world_size, ctx.rank
    for k in range(n - 1):
        s_lo, s_hi = bounds[(r - k - shift) % n]
        g_lo, g_hi = bounds[(r - k - 1 - shift) % n]
        incoming = torch.empty(g_hi - g_lo, dtype=buf.dtype, device=buf.device)
        _ring_step(ctx, buf[s_lo:s_hi], incoming, sent)
        buf[g_lo:g_hi] += incoming


def _ring_all_gather(ctx, buf, bounds, shift: int, sent: list[int]) -> None:
    import torch

    n, r = ctx.world_size, ctx.rank
    for k in range(n - 1):
        s_lo, s_hi = bounds[(r - k + shift) % n]
        g_lo, g_hi = bounds[(r - k - 1 + shift) % n]
        incoming = torch.empty(g_hi - g_lo, dtype=buf.dtype, device=buf.device)
        _ring_step(ctx, buf[s_lo:s_hi], incoming, sent)
        buf[g_lo:g_hi] = incoming


def _all_gather_single(out, inp) -> None:
    import torch.distributed as dist

    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp)


def _reduce_scatter_single(out, inp) -> None:
    import torch.distributed as dist

    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp)


def ring_collective_rank(ctx, example: dict) -> dict:
    """Rank function: ring collective over point-to-point vs torch's collective.

    ``example``: ``{"collective": "all_reduce"|"all_gather"|"reduce_scatter",
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
    if coll == "all_reduce":
        ring = full.clone()
        _ring_reduce_scatter(ctx, ring, bounds, 0, sent)
        _ring_all_gather(ctx, ring, bounds, 1, sent)
        ours = ring
        ref = full.clone()
        with counter:
            dist.all_reduce(ref)
    elif coll == "reduce_scatter":
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
    """One even and one uneven size per collective (uneven: numel % n != 0 when n > 1)."""
    out = []
    for coll in RING_COLLECTIVES:
        out.append({"collective": coll, "numel": 12 * world_size, "seed": 1})
        out.append({"collective": coll, "numel": 12 * world_size + 1, "seed": 2})
    return out


def _expected_bytes(coll: str, numel: int, n: int, itemsize: int = 8) -> tuple[list[int], Fraction]:
    """Per-rank bytes of the numpy ring (distcheck.comm) and the closed form for S = numel*itemsize."""
    import numpy as np

    from distcheck import comm
    from distcheck.closed_form import get

    S = numel * itemsize
    form = Fraction(get(f"comm.bytes_per_rank.{coll}").evaluate(size_bytes=S, n=n))
    rng = np.random.default_rng(0)
    if coll == "all_gather":
        shards = [rng.integers(-5, 5, size=b - a).astype(np.float64) for a, b in chunk_bounds(numel, n)]
        res = comm.ring_all_gather(shards)
    else:
        arrays = [rng.integers(-5, 5, size=numel).astype(np.float64) for _ in range(n)]
        res = comm.ring_all_reduce(arrays) if coll == "all_reduce" else comm.ring_reduce_scatter(arrays)
    return list(res.sent_bytes), form


def run_collective_checks(pool_or_world_sizes=(2, 4), *, backend: str = "gloo", examples: Sequence[dict] | None = None,
                          timeout_s: float = 60.0) -> list[CheckResult]:
    """Check measured bytes per rank of ring collectives against ``comm.bytes_per_rank.*``.

    One row per (collective, world). A row passes when, for every example and
    rank: the ring result equals torch's collective bitwise; torch's call was
    measured at the full size S = numel * 8 bytes; the bytes the rank sent equal
    ``comm.bytes_per_rank.<collective>(S, n)`` exactly (when ``n`` divides
    numel) and the numpy ring of :mod:`distcheck.comm` rank for rank (always).
    ``threaded`` rows are ``skip`` (no point-to-point there).

    Args:
        pool_or_world_sizes: a ``RankPool``, an int or a sequence of world sizes.
        backend: backend for pools opened here ("gloo", "nccl", "threaded").
        examples: dicts as :func:`ring_collective_rank` takes; default
            :func:`default_collective_examples`.
    """
    rows: list[CheckResult] = []
    for pool, ws, be, skip in iter_pools(pool_or_world_sizes, backend, timeout_s):
        for coll in RING_COLLECTIVES:
            check = f"comm.bytes_per_rank.{coll}"
            if skip:
                rows.append(skip_row(check, be, ws, skip))
                continue
            if be not in _BACKENDS_WITH_P2P:
                rows.append(skip_row(check, be, ws, f"backend {be!r} has no point-to-point send/recv; run on gloo or nccl"))
                continue
            exs = [e for e in (examples or default_collective_examples(ws)) if e["collective"] == coll]
            ok, worst, details, summary = True, 0.0, [], []
            for ex in exs:
                results, err = run_guarded(pool, ring_collective_rank, ex)
                if err:
                    ok = False
                    details.append(err)
                    break
                expected_ring, form = _expected_bytes(coll, ex["numel"], ws)
                S = ex["numel"] * 8
                summary.append((ex, max(res["sent_bytes"] for res in results)))
                for rk, res in enumerate(results):
                    worst = max(worst, res["max_error"])
                    bad = []
                    if not res["equal"]:
                        bad.append("ring result != torch collective")
                    uneven_gloo = coll == "all_gather" and ex["numel"] % ws and be not in UNEVEN_ALL_GATHER
                    kind = "all_reduce" if uneven_gloo else coll
                    if res["measured"] != [(kind, S)]:
                        bad.append(f"torch's call measured {res['measured']}, expected [({kind!r}, {S})]")
                    if res["sent_bytes"] != expected_ring[rk]:
                        bad.append(f"sent {res['sent_bytes']} B, numpy ring {expected_ring[rk]} B")
                    if ex["numel"] % ws == 0 and Fraction(res["sent_bytes"]) != form:
                        bad.append(f"sent {res['sent_bytes']} B, closed form {form} B")
                    if bad:
                        ok = False
                        details.append(f"numel={ex['numel']} rank {rk}: " + "; ".join(bad))
            detail = details[0] if details else "; ".join(
                f"S={e['numel'] * 8} B: {sent} B per rank" for e, sent in summary) + " (closed form when n | numel, else numpy ring)"
            if (not details and coll == "all_gather" and be not in UNEVEN_ALL_GATHER
                    and any(e["numel"] % ws for e in exs)):
                detail += (f"; uneven all_gather unsupported on {be} (equal shards only): torch's reference there is "
                           "a zero-padded all_reduce; the nccl path runs the real uneven all_gather")
            rows.append(result_row(check, be, ws, len(exs), ok, max_error=worst, bound=0.0, detail=detail))
    return rows
