"""Hypothesis strategies of checkpoints: a model's tensors with Adam's state saved under one layout and
loaded under another (uneven shards included), and the kill point of an interrupted save.

Public path: :mod:`distcheck.strategies` (Hypothesis' conventions are listed there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from distcheck.core.validate import check_positive_int
from distcheck.engine.strategies import defines

__all__ = ["ReshardCase", "SwapCase", "reshard_cases", "swap_cases"]


@dataclass(frozen=True)
class ReshardCase:
    """A model's tensors ``params`` (name -> array), Adam's ``moments`` (name -> (exp_avg, exp_avg_sq))
    and ``step``, the gradient ``grads`` of the next step; saved under ``(layout_a, dims_a)`` over
    ``world_a`` ranks, loaded under ``(layout_b, dims_b)`` over ``world_b``."""

    params: dict
    moments: dict
    step: int
    grads: dict
    layout_a: str
    dims_a: tuple
    world_a: int
    layout_b: str
    dims_b: tuple
    world_b: int

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [a.shape for a in self.params.values()]

    def __repr__(self) -> str:
        shapes = " ".join("x".join(map(str, s)) for s in self.shapes)
        dims = lambda ds: ",".join("-" if d is None else str(d) for d in ds)  # noqa: E731
        return (f"ReshardCase(shapes {shapes}, {self.params[next(iter(self.params))].dtype}, step={self.step}, "
                f"save {self.layout_a}({dims(self.dims_a)}) at {self.world_a}, "
                f"load {self.layout_b}({dims(self.dims_b)}) at {self.world_b})")


@dataclass(frozen=True)
class SwapCase:
    """The files of a complete checkpoint ``old``, those of the next one ``new``, and ``kill_at``: the save
    of ``new`` is killed after its first write that brings its bytes to at least ``kill_at``."""

    old: dict
    new: dict
    kill_at: int


def _v_reshard(*, max_world_size: Any, max_dim: Any) -> None:  # user input
    check_positive_int("max_world_size", max_world_size)
    check_positive_int("max_dim", max_dim)


def _layout(draw: st.DrawFn, shapes: list[tuple[int, ...]], max_world_size: int
            ) -> tuple[str, tuple[int | None, ...], int]:
    from distcheck.parallel.checkpoint.reference import LAYOUTS, layout_dims

    kind = draw(st.sampled_from(LAYOUTS))
    tp_dims = [draw(st.sampled_from([None, *range(len(s))])) for s in shapes] if kind == "tp" else None
    return kind, layout_dims(kind, shapes, tp_dims), draw(st.integers(1, max_world_size))


@defines(_v_reshard)
def reshard_cases(draw: st.DrawFn, *, max_world_size: int = 8, max_dim: int = 7) -> ReshardCase:
    """A :class:`ReshardCase`: 1 to 3 tensors of 1 or 2 dimensions up to ``max_dim`` each, in float64, float32
    or float16, any bits that are finite numbers; two layouts over 1 to ``max_world_size`` ranks each."""
    dtype = draw(st.sampled_from((np.float64, np.float32, np.float16)))
    shapes = draw(st.lists(st.lists(st.integers(1, max_dim), min_size=1, max_size=2).map(tuple),
                           min_size=1, max_size=3))

    def array(shape: tuple[int, ...], low: int = -64, high: int = 64) -> np.ndarray:
        n = int(np.prod(shape))
        vals = draw(st.lists(st.integers(low, high), min_size=n, max_size=n))
        return (np.array(vals, dtype=np.float64).reshape(shape) / 8).astype(dtype)

    params = {f"t{i}": array(s) for i, s in enumerate(shapes)}
    moments = {k: (array(a.shape), array(a.shape, 0)) for k, a in params.items()}
    grads = {k: array(a.shape) for k, a in params.items()}
    layout_a, dims_a, world_a = _layout(draw, shapes, max_world_size)
    layout_b, dims_b, world_b = _layout(draw, shapes, max_world_size)
    return ReshardCase(params, moments, draw(st.integers(1, 1000)), grads, layout_a, dims_a, world_a,
                       layout_b, dims_b, world_b)


def _v_swap(*, max_files: Any, max_bytes: Any) -> None:  # user input
    check_positive_int("max_files", max_files)
    check_positive_int("max_bytes", max_bytes)


@defines(_v_swap)
def swap_cases(draw: st.DrawFn, *, max_files: int = 3, max_bytes: int = 64) -> SwapCase:
    """A :class:`SwapCase`: two checkpoints of 1 to ``max_files`` files of up to ``max_bytes`` bytes, and a
    kill point from 0 to past the new save's last byte (a kill point past it: the save completes)."""
    names = st.sampled_from(("model.bin", "optim.bin", "rng.bin", "extra.bin"))
    files = st.dictionaries(names, st.binary(max_size=max_bytes), min_size=1, max_size=max_files)
    old, new = draw(files), draw(files)
    total = sum(map(len, new.values())) + 160 * len(new) + 64
    return SwapCase(old, new, draw(st.integers(0, total)))
