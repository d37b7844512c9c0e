"""Hypothesis strategies of the step's reductions: a composition and the values its ranks hold.

A :class:`StepReductionCase` draws a layout (dp_replicate, dp_shard, tp, pp, each a power of two, the world
at most ``max_world_size``), m micro-batches per dp rank with integer per-token losses and padding masks
(token counts differ per rank and per micro-batch), parameters with their placements (tp-sharded along a
dimension or tp-replicated, on a pipeline stage) and integer gradients, the per-tp-rank partial gradients of
a replicated norm weight (sequence parallelism), and a clipping threshold. Integers and power-of-two
degrees keep every sum and every division by a degree exact in float64, so the properties compare bit for bit.

Public path: :mod:`distcheck.strategies`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from distcheck.core.validate import check_interval
from distcheck.engine.strategies import defines
from distcheck.parallel.step.reference import Placement, StepLayout

__all__ = ["StepReductionCase", "step_reduction_cases"]


@dataclass(frozen=True)
class StepReductionCase:
    """``layout``; ``losses[d][k]`` / ``masks[d][k]`` (dp rank d, micro-batch k: per-token integer losses and
    the tokens that count); ``grads`` (full integer gradients) with ``placements``; ``norm_partials[t]`` (tp
    rank t's partial gradient of a replicated norm weight); ``norm`` and ``max_norm`` for clipping."""

    layout: StepLayout
    losses: tuple
    masks: tuple
    grads: tuple
    placements: tuple
    norm_partials: tuple
    norm: float
    max_norm: float

    def __repr__(self) -> str:
        counts = [[int(np.count_nonzero(m)) for m in rank] for rank in self.masks]
        params = "; ".join(f"{g.shape} {'tp-replicated' if p.tp_dim is None else f'tp dim {p.tp_dim}'} stage "
                           f"{p.stage}" for g, p in zip(self.grads, self.placements, strict=True))
        clip = "clip binds" if self.norm > self.max_norm else "clip free"
        kept = [[[f"{x:g}" for x, keep in zip(loss.tolist(), mask.tolist(), strict=True) if keep]
                 for loss, mask in zip(r_loss, r_mask, strict=True)] for r_loss, r_mask in zip(self.losses, self.masks,
                                                                                               strict=True)]
        kept_text = str(kept).replace("'", "")
        return (f"StepReductionCase({self.layout}, m={len(self.masks[0])}, {clip}; tokens [dp rank][micro-batch] "
                f"{counts}; kept tokens' losses {kept_text}; params {params}; grads "
                f"{[g.tolist() for g in self.grads]}; norm partials {[p.tolist() for p in self.norm_partials]}; "
                f"norm={self.norm:g}, max_norm={self.max_norm:g})")


def _v(*, max_world_size: int) -> None:
    check_interval("min_world_size", 1, "max_world_size", max_world_size)


_POW2 = (1, 2, 4)


@defines(_v)
def step_reduction_cases(draw: st.DrawFn, *, max_world_size: int = 8) -> StepReductionCase:
    """A :class:`StepReductionCase` whose layout has at most ``max_world_size`` ranks (default 8)."""
    while True:
        dr, ds, tp, pp = (draw(st.sampled_from(_POW2)) for _ in range(4))
        if dr * ds * tp * pp <= max_world_size:
            break
    layout = StepLayout(dr, ds, tp, pp)
    m, seq = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    small = st.integers(-4, 4)

    def ints(shape: tuple[int, ...]) -> np.ndarray:
        return np.array(draw(st.lists(small, min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))),
                        dtype=np.float64).reshape(shape)

    losses = tuple(tuple(np.abs(ints((seq,))) for _ in range(m)) for _ in range(layout.dp))
    masks = tuple(tuple(np.arange(seq) < draw(st.integers(1, seq)) for _ in range(m)) for _ in range(layout.dp))
    n_params = draw(st.integers(1, 3))
    placements, grads = [], []
    for i in range(n_params):
        tp_dim = draw(st.sampled_from((None, 0, 1)))
        placements.append(Placement(tp_dim, draw(st.integers(0, pp - 1)) if i else 0))
        shape = (draw(st.integers(1, 4)) * (tp if tp_dim == 0 else 1), draw(st.integers(1, 3)) * (tp if tp_dim == 1
                                                                                               else 1))
        grads.append(ints(shape))
    width = draw(st.integers(1, 3))
    partials = tuple(ints((width,)) for _ in range(tp))
    norm = float(draw(st.integers(0, 64)))
    max_norm = float(draw(st.sampled_from((1, 8, 32, 128))))
    return StepReductionCase(layout, losses, masks, tuple(grads), tuple(placements), partials, norm, max_norm)
