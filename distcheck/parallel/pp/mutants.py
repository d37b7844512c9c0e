"""Mutants of the pipeline's accounting.

=========================  ==============================================  ================================
mutant                     mistake                                         killed by
=========================  ==============================================  ================================
pipeline.ratio_as_fraction (p-1)/m (idle relative to IDEAL time)           pipeline.bubble_fraction.formula
                           labelled as idle / total
pipeline.stash_ignores_m   1F1B stash taken as p, without min(p, m)        pipeline.stash.formula (m < p)
=========================  ==============================================  ================================
"""

from __future__ import annotations

from fractions import Fraction

from distcheck.core.vocab import Schedule
from distcheck.engine.mutants import mutant

__all__ = ["bubble_ratio_as_fraction", "stash_ignores_few_microbatches"]


@mutant("pipeline.ratio_as_fraction", "pipeline.bubble_fraction.formula")
def bubble_ratio_as_fraction(schedule, p, m, v=1):
    """(p-1)/m (idle relative to IDEAL time; (p-1)/(v m) interleaved) labelled as idle / total."""
    return Fraction(p - 1, v * m)


@mutant("pipeline.stash_ignores_m", "pipeline.stash.formula")
def stash_ignores_few_microbatches(schedule, p, m, v=1):
    """Activation stash of 1F1B taken as p micro-batches (interleaved: (v+1) p - 1 chunks) without
    the min with m (v m): too many when there are fewer micro-batches than stages (m < p)."""
    if schedule == Schedule.GPIPE:
        return m
    return p if schedule == Schedule.ONE_F_ONE_B else (v + 1) * p - 1
