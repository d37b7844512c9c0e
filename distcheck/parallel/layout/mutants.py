"""Mutants of the 3D layout.

======================  ===============================================  ====================
mutant                  mistake                                          killed by
======================  ===============================================  ====================
layout.tp_outermost     the mesh order reversed: TP groups strided       layout.tp.node_local
                        across nodes (by dp * pp * cp)
layout.contiguous_      every axis's groups as consecutive blocks of     layout.groups.partition
blocks                  its degree (as if each axis were innermost)
layout.coords_          coords read with the order reversed (the         layout.coords.bijection
reversed                outermost axis taken as the fastest-varying)
======================  ===============================================  ====================
"""

from __future__ import annotations

import dataclasses

from distcheck.engine.mutants import mutant
from distcheck.parallel.layout.reference import ParallelConfig, _order, _world, coords, groups

__all__ = ["groups_tp_outermost", "groups_contiguous_blocks", "coords_reversed_order"]


@mutant("layout.tp_outermost", "layout.tp.node_local")
def groups_tp_outermost(cfg: ParallelConfig, axis: str) -> list[list[int]]:
    """Groups of a mesh laid out in the REVERSED order (tp outermost): TP ranks strided across nodes."""
    return groups(dataclasses.replace(cfg, order=tuple(reversed(_order(cfg)))), axis)


@mutant("layout.contiguous_blocks", "layout.groups.partition")
def groups_contiguous_blocks(cfg: ParallelConfig, axis: str) -> list[list[int]]:
    """Every axis's groups as consecutive blocks of degree(axis) ranks, as if each axis were the
    innermost: right for the innermost axis only, the others mix indices of inner axes."""
    d = cfg.degree(axis)
    return [list(range(i, i + d)) for i in range(0, _world(cfg), d)]


@mutant("layout.coords_reversed", "layout.coords.bijection")
def coords_reversed_order(cfg: ParallelConfig, rank: int) -> dict[str, int]:
    """coords with the order read backwards (the outermost axis varying fastest): a bijection onto
    the grid, but not the inverse of rank_of."""
    return coords(dataclasses.replace(cfg, order=tuple(reversed(_order(cfg)))), rank)
