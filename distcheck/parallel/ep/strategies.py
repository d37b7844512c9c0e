"""Hypothesis strategies of expert-parallel MoE layers.

Entries are multiples of 1/4 in [-2, 2] (exact in every format); with h and the FFN width at most 2 the
logits and the experts' outputs are exact sums, so a wrong gate, a permuted expert or a missing residual
moves an output by far more than any rounding. Capacity factors are drawn from {1/2, 1, 3/2, 2}: the
first drops choices on most cases, the last on none.

Public path: :mod:`distcheck.strategies` (Hypothesis' conventions are listed there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from distcheck.core.validate import check_at_least, check_interval
from distcheck.core.vocab import Router as _Router
from distcheck.core.vocab import names
from distcheck.engine.strategies import defines, draw_ints

__all__ = ["EPMoECase", "ep_moe_cases"]


def _show(a: Any) -> str:
    return repr(np.asarray(a).tolist())


@dataclass(frozen=True)
class EPMoECase:
    """An MoE layer on ``ep`` ranks: tokens ``x`` and ``dout`` (ep n, h), the router ``wg`` (h, E), experts ``w1``
    (E, h, f) and ``w2`` (E, f, h), top-``k`` with ``capacity_factor`` under ``router``; rank r holds tokens
    ``r n .. (r+1) n - 1`` and experts ``r E/ep .. (r+1) E/ep - 1``."""

    x: np.ndarray
    wg: np.ndarray
    w1: np.ndarray
    w2: np.ndarray
    dout: np.ndarray
    ep: int
    k: int
    capacity_factor: float
    router: str

    def __repr__(self) -> str:
        return (f"EPMoECase(ep={self.ep}, k={self.k}, capacity_factor={self.capacity_factor}, router={self.router!r}, "
                f"x={_show(self.x)}, wg={_show(self.wg)}, w1={_show(self.w1)}, w2={_show(self.w2)}, "
                f"dout={_show(self.dout)})")


def _v(*, min_ep: Any, max_ep: Any, max_tokens: Any, max_local_experts: Any, max_h: Any, max_ffn: Any,
       max_k: Any) -> Any:
    check_interval("min_ep", min_ep, "max_ep", max_ep)
    check_at_least("min_ep", min_ep, 1)
    for name, value in (("max_tokens", max_tokens), ("max_local_experts", max_local_experts), ("max_h", max_h),
                        ("max_ffn", max_ffn), ("max_k", max_k)):
        check_at_least(name, value, 1)


@defines(_v)
def ep_moe_cases(draw: Any, *, min_ep: int = 1, max_ep: int = 4, max_tokens: int = 3, max_local_experts: int = 2,
                 max_h: int = 2, max_ffn: int = 2, max_k: int = 2) -> EPMoECase:
    """An :class:`EPMoECase`: 1 to ``max_tokens`` tokens and experts per rank, top-k with k <= ``max_k``."""
    ep = draw(st.integers(min_ep, max_ep))
    n, E = draw(st.integers(1, max_tokens)), ep * draw(st.integers(1, max_local_experts))
    h, f = draw(st.integers(1, max_h)), draw(st.integers(1, max_ffn))
    k = draw(st.integers(1, min(max_k, E)))
    cf = draw(st.sampled_from([0.5, 1.0, 1.5, 2.0]))
    router = draw(st.sampled_from(names(_Router)))
    T = ep * n

    def q(shape: Any) -> Any:
        return draw_ints(draw, shape, 8) / 4

    return EPMoECase(x=q((T, h)), wg=q((h, E)), w1=q((E, h, f)), w2=q((E, f, h)), dout=q((T, h)), ep=ep, k=k,
                     capacity_factor=cf, router=router)
