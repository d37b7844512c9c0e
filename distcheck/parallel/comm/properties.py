"""Communication-volume properties: the ring simulations against nccl-tests' per-rank
volumes, and ZeRO-3's 1.5x DDP. Exact (integer bytes, Fractions).

Implementation slot: ``simulate(collective, size_bytes, n, *, dtype) -> CommResult``
(:func:`distcheck.parallel.comm.simulate`).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from distcheck.core.errors import PropertyFailure
from distcheck.core.vocab import Collective
from distcheck.engine.catalogue import form_value
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl
from distcheck.parallel.comm import strategies as ds
from distcheck.parallel.comm.strategies import CollectiveCase

if TYPE_CHECKING:
    from distcheck.parallel.comm.reference import CommResult

__all__ = ["volume_matches_closed_form", "zero3_is_one_and_a_half_ddp"]


def _simulate(*args: Any, **kwargs: Any) -> CommResult:
    from distcheck.parallel.comm.reference import simulate

    return simulate(*args, **kwargs)


def _form(collective: str, size_bytes: int, n: int) -> int | Fraction:
    return form_value(f"comm.bytes_per_rank.{collective}", size_bytes=size_bytes, n=n)


def volume_matches_closed_form(case: CollectiveCase, *, impl: Callable[..., CommResult] = _simulate) -> None:
    """Bytes sent per rank == comm.bytes_per_rank.<collective>(S, n).

    Even chunking: every rank sends exactly the closed form (broadcast: the first n-1
    ranks send S, the last 0; nothing for n = 1). Uneven chunking: the total over
    ranks is exactly n x the closed form and the maximum exceeds it by less than one
    element per ring phase (2 for all-reduce, 1 otherwise).
    """
    res = call_impl("simulate", impl, case.collective, case.size_bytes, case.n, dtype=case.dtype)
    S, n = case.size_bytes, case.n
    if case.collective == Collective.BROADCAST:
        expected = [S] * (n - 1) + [0] if n >= 2 else [0]
        if list(res.sent_bytes) != expected:
            raise PropertyFailure(f"broadcast bytes per rank for {case}", expected=expected, got=list(res.sent_bytes))
        if n >= 2 and max(res.sent_bytes) != _form(Collective.BROADCAST, S, n):
            raise PropertyFailure(f"broadcast max bytes for {case}", expected=_form(Collective.BROADCAST, S, n),
                                  got=max(res.sent_bytes))
        return
    ideal = _form(case.collective, S, n)
    itemsize = res.itemsize
    if (S // itemsize) % n == 0:
        if any(Fraction(b) != ideal for b in res.sent_bytes):
            raise PropertyFailure(f"bytes per rank for {case}", expected=ideal, got=list(res.sent_bytes))
        return
    if Fraction(sum(res.sent_bytes)) != n * ideal:
        raise PropertyFailure(f"total bytes over ranks for {case}", expected=n * ideal, got=sum(res.sent_bytes))
    phases = 2 if case.collective == Collective.ALL_REDUCE else 1
    if not Fraction(max(res.sent_bytes)) - ideal < phases * itemsize:
        raise PropertyFailure(f"max bytes per rank exceeds the ideal by a whole element per phase for {case}",
                              expected=f"< {ideal + phases * itemsize}", got=max(res.sent_bytes))


def zero3_is_one_and_a_half_ddp(case: CollectiveCase, *, impl: Callable[..., CommResult] = _simulate) -> None:
    """Simulated bytes per rank: ZeRO-3 (2 all-gathers + 1 reduce-scatter of S) == 1.5 x DDP
    (one all-reduce of S), and both == zero.comm_elements_per_rank(exact_ring=True) x itemsize."""
    from distcheck.parallel.zero.reference import comm_elements_per_rank

    n = max(case.n, 2)
    itemsize = 8
    count = n * max(1, case.size_bytes // itemsize)  # even chunking
    S = count * itemsize
    ddp = max(call_impl("simulate", impl, Collective.ALL_REDUCE, S, n, dtype="int64").sent_bytes)
    z3 = (2 * max(call_impl("simulate", impl, Collective.ALL_GATHER, S, n, dtype="int64").sent_bytes)
          + max(call_impl("simulate", impl, Collective.REDUCE_SCATTER, S, n, dtype="int64").sent_bytes))
    if Fraction(z3) != Fraction(3, 2) * ddp:
        raise PropertyFailure(f"ZeRO-3 bytes vs 1.5 x DDP for S={S}, n={n}", expected=Fraction(3, 2) * ddp, got=z3)
    for stage, got in ((0, ddp), (3, z3)):
        expected = comm_elements_per_rank(count, n, stage, exact_ring=True) * itemsize
        if Fraction(got) != Fraction(expected):
            raise PropertyFailure(f"stage {stage} simulated bytes vs distcheck.parallel.zero for S={S}, n={n}",
                                  expected=expected, got=got)


_COLLECTIVES = tuple(Collective)


def _edges() -> tuple[CollectiveCase, ...]:
    """One rank (nothing to send); 5 int64 elements over 2 and 4 ranks (uneven chunks) for every collective."""
    C = ds.CollectiveCase
    return (C(Collective.ALL_REDUCE, 40, 1), *(C(c, 40, n) for n in (2, 4) for c in _COLLECTIVES))


register(Property("comm.volume.closed_form", lambda: ds.collective_cases(), volume_matches_closed_form,
                  "ring simulations send exactly the nccl-tests per-rank volume "
                  "(uneven: total exact, max < +1 element/phase)",
                  _simulate, "simulate(collective, size_bytes, n, *, dtype) -> CommResult", _edges))
register(Property("comm.zero3.one_and_a_half_ddp", lambda: ds.collective_cases(collectives=(Collective.ALL_REDUCE,)),
                  zero3_is_one_and_a_half_ddp, "ZeRO-3 moves exactly 1.5x the bytes of DDP (simulated rings)",
                  _simulate, "simulate(collective, size_bytes, n, *, dtype) -> CommResult",
                  lambda: tuple(c for c in _edges() if c.collective == Collective.ALL_REDUCE)))
