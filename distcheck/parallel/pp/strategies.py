"""Hypothesis strategies of pipeline schedules: (schedule, p, m, v, t_f, t_b) respecting each
schedule's constraints.

Public path: :mod:`distcheck.strategies` (Hypothesis' conventions are listed there).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from distcheck.core.validate import check_interval, check_subset
from distcheck.core.vocab import Schedule, names
from distcheck.engine.strategies import defines

__all__ = ["PipelineParams", "pipeline_params"]


SCHEDULES = names(Schedule)


@dataclass(frozen=True)
class PipelineParams:
    """Inputs of :func:`distcheck.pipeline.simulate` and the ``pipeline.*`` closed forms."""

    schedule: str
    p: int
    m: int
    v: int = 1
    t_f: int = 1
    t_b: int = 2

    def as_kwargs(self) -> dict:
        return dict(schedule=self.schedule, p=self.p, m=self.m, v=self.v, t_f=self.t_f, t_b=self.t_b)


def _interleaved_stages(min_stages, max_stages, min_microbatches, max_microbatches) -> list[int]:
    return [p for p in range(min_stages, max_stages + 1) if -(-min_microbatches // p) * p <= max_microbatches]


def _v_pipeline_params(*, schedules, min_stages, max_stages, min_microbatches, max_microbatches, min_v, max_v,
                       min_t_f, max_t_f, min_t_b, max_t_b):
    chosen = check_subset("schedules", schedules, SCHEDULES)
    check_interval("min_stages", min_stages, "max_stages", max_stages)
    check_interval("min_microbatches", min_microbatches, "max_microbatches", max_microbatches)
    check_interval("min_v", min_v, "max_v", max_v, at_least=2)
    check_interval("min_t_f", min_t_f, "max_t_f", max_t_f)
    check_interval("min_t_b", min_t_b, "max_t_b", max_t_b)
    if chosen == (Schedule.INTERLEAVED,) and not _interleaved_stages(min_stages, max_stages, min_microbatches, max_microbatches):
        raise InvalidArgument(
            f"the interleaved schedule needs m to be a multiple of p, and no m in [min_microbatches={min_microbatches}, "
            f"max_microbatches={max_microbatches}] is a multiple of any p in [min_stages={min_stages}, max_stages={max_stages}]"
        )


@defines(_v_pipeline_params)
def pipeline_params(
    draw,
    *,
    schedules: tuple[str, ...] = SCHEDULES,
    min_stages: int = 1, max_stages: int = 8,
    min_microbatches: int = 1, max_microbatches: int = 16,
    min_v: int = 2, max_v: int = 4,
    min_t_f: int = 1, max_t_f: int = 3,
    min_t_b: int = 1, max_t_b: int = 6,
) -> PipelineParams:
    """A :class:`PipelineParams` respecting its schedule's constraints.

    - ``schedules``: subset of ("gpipe", "1f1b", "interleaved"); default all three.
    - gpipe/1f1b: v = 1, any p, m. interleaved: v in [min_v, max_v] (>= 2) and
      m a multiple of p (Narayanan et al. 2021 §2.2.2); an interleaved draw whose
      ranges admit no such (p, m) falls back to another schedule.
    - ``t_f``, ``t_b``: integer ticks per forward / backward (defaults 1..3, 1..6).
    """
    feasible = _interleaved_stages(min_stages, max_stages, min_microbatches, max_microbatches)
    options = tuple(s for s in schedules if s != Schedule.INTERLEAVED or feasible)
    schedule = draw(st.sampled_from(options))
    t_f = draw(st.integers(min_t_f, max_t_f))
    t_b = draw(st.integers(min_t_b, max_t_b))
    if schedule == Schedule.INTERLEAVED:
        p = draw(st.sampled_from(feasible))
        k = draw(st.integers(-(-min_microbatches // p), max_microbatches // p))
        return PipelineParams(schedule, p, k * p, draw(st.integers(min_v, max_v)), t_f, t_b)
    p = draw(st.integers(min_stages, max_stages))
    m = draw(st.integers(min_microbatches, max_microbatches))
    return PipelineParams(schedule, p, m, 1, t_f, t_b)
