"""Hypothesis strategies of collectives: a collective, the full tensor's bytes and the ranks.

Public path: :mod:`distcheck.strategies` (Hypothesis' conventions are listed there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from distcheck.core.validate import check_interval, check_subset
from distcheck.core.vocab import Collective, names
from distcheck.engine.strategies import defines

__all__ = ["CollectiveCase", "collective_cases"]


COLLECTIVES = names(Collective)


@dataclass(frozen=True)
class CollectiveCase:
    """A collective over ``n`` ranks of a FULL tensor of ``size_bytes`` (nccl-tests convention)."""

    collective: str
    size_bytes: int
    n: int
    dtype: str = "int64"


def _v_collective_cases(*, collectives: tuple[str, ...], min_ranks: int, max_ranks: int, min_elements: int,
                        max_elements: int) -> None:
    check_subset("collectives", collectives, COLLECTIVES)
    check_interval("min_ranks", min_ranks, "max_ranks", max_ranks)
    check_interval("min_elements", min_elements, "max_elements", max_elements, at_least=0)


@defines(_v_collective_cases)
def collective_cases(
    draw: st.DrawFn,
    *,
    collectives: tuple[str, ...] = COLLECTIVES,
    min_ranks: int = 1, max_ranks: int = 8,
    min_elements: int = 0, max_elements: int = 64,
) -> CollectiveCase:
    """A :class:`CollectiveCase` (int64 elements, so sizes are multiples of 8 bytes;
    element counts need not divide by n)."""
    dtype = draw(st.sampled_from(("int64", "int32")))
    count = draw(st.integers(min_elements, max_elements))
    return CollectiveCase(draw(st.sampled_from(tuple(collectives))), count * np.dtype(dtype).itemsize,
                          draw(st.integers(min_ranks, max_ranks)), dtype)
