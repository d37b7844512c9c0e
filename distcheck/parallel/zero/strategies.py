"""Hypothesis strategies of ZeRO: parameter counts, data-parallel degrees and optimizer bytes.

Public path: :mod:`distcheck.strategies` (Hypothesis' conventions are listed there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_at_least, check_interval
from distcheck.engine.strategies import defines

__all__ = ["ZeroCase", "zero_cases"]


@dataclass(frozen=True)
class ZeroCase:
    """ZeRO inputs: ``params`` (Ψ), ``dp`` (N_d ranks) and ``k`` (optimizer bytes per param)."""

    params: int
    dp: int
    k: int = 12


def _v_zero_cases(*, min_params: int, max_params: int, min_dp: int, max_dp: int, ks: Any) -> None:  # ks: user input
    check_interval("min_params", min_params, "max_params", max_params)
    check_interval("min_dp", min_dp, "max_dp", max_dp)
    try:
        items = tuple(ks)
    except TypeError:
        raise ConfigError("ks", ks, "must be a sequence of ints") from None
    if not items:
        raise ConfigError("ks", ks, "must not be empty")
    for k in items:
        check_at_least("ks[]", k, 0)


@defines(_v_zero_cases)
def zero_cases(
    draw: st.DrawFn,
    *,
    min_params: int = 1, max_params: int = 10**12,
    min_dp: int = 1, max_dp: int = 1024,
    ks: tuple[int, ...] = (12,),
) -> ZeroCase:
    """A :class:`ZeroCase`; ``ks``: optimizer bytes per parameter to draw from (default (12,), ZeRO's K)."""
    return ZeroCase(draw(st.integers(min_params, max_params)), draw(st.integers(min_dp, max_dp)),
                    draw(st.sampled_from(tuple(ks))))
