"""Mutants of the 3D layout.

======================  ===============================================  ====================
mutant                  mistake                                          killed by
======================  ===============================================  ====================
layout.tp_outermost     the mesh order reversed: TP groups strided       layout.tp.node_local
                        across nodes (by dp * pp * cp)
======================  ===============================================  ====================
"""

from __future__ import annotations

import dataclasses

from distcheck.engine.mutants import mutant
from distcheck.parallel.layout.reference import groups

__all__ = ["groups_tp_outermost"]


@mutant("layout.tp_outermost", "layout.tp.node_local")
def groups_tp_outermost(cfg, axis):
    """Groups of a mesh laid out in the REVERSED order (tp outermost): TP ranks strided across nodes."""
    return groups(dataclasses.replace(cfg, order=tuple(reversed(cfg.order))), axis)
