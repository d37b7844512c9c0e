"""3D-layout properties: groups partition the world, sizes are the degrees, TP stays on a
node, coords <-> rank is a bijection. Exact (integers).

Implementation slots: ``groups(cfg, axis) -> list[list[int]]`` (:func:`distcheck.parallel.layout.groups`)
and ``coords(cfg, rank) -> dict`` (:func:`distcheck.parallel.layout.coords`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from hypothesis import strategies as st

from distcheck.core.errors import ConfigError, PropertyFailure
from distcheck.core.vocab import LAYOUT_ORDER
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl
from distcheck.parallel.layout import strategies as ds

if TYPE_CHECKING:
    from distcheck.parallel.layout.reference import ParallelConfig

__all__ = ["groups_partition", "tp_node_local", "coords_bijection"]

AXES = LAYOUT_ORDER


def _groups(cfg: ParallelConfig, axis: str) -> list[list[int]]:
    from distcheck.parallel.layout.reference import groups

    return groups(cfg, axis)


def _coords(cfg: ParallelConfig, rank: int) -> dict[str, int]:
    from distcheck.parallel.layout.reference import coords

    return coords(cfg, rank)


def groups_partition(cfg: ParallelConfig, *, impl: Callable[[ParallelConfig, str], list[list[int]]] = _groups) -> None:
    """For each axis: every rank in exactly one group, each group of size degree(axis),
    layout.num_groups groups, and members differing only along that axis."""
    from distcheck.engine.catalogue import get
    from distcheck.parallel.layout.reference import coords

    world = get("layout.world_size").evaluate(tp=cfg.tp, pp=cfg.pp, dp=cfg.dp, cp=cfg.cp)
    if cfg.world_size != world:
        raise PropertyFailure(f"world size of {cfg}", expected=world, got=cfg.world_size)
    for axis in AXES:
        gs = call_impl("groups", impl, cfg, axis)
        degree = cfg.degree(axis)
        n_groups = get("layout.num_groups").evaluate(world_size=world, degree=degree)
        if len(gs) != n_groups:
            raise PropertyFailure(f"{axis}: number of groups for {cfg}", expected=n_groups, got=len(gs))
        seen = sorted(r for g in gs for r in g)
        if seen != list(range(int(world))):
            raise PropertyFailure(f"{axis}: groups must cover every rank exactly once for {cfg}",
                                  expected=f"range({world})", got=seen)
        for g in gs:
            if len(g) != degree:
                raise PropertyFailure(f"{axis}: group {g} has the wrong size for {cfg}", expected=degree, got=len(g))
            others = {tuple(v for a, v in coords(cfg, r).items() if a != axis) for r in g}
            if len(others) != 1:
                raise PropertyFailure(f"{axis}: group {g} mixes indices of other axes for {cfg}",
                                      expected="one index tuple", got=sorted(others))


def _node_local_configs() -> st.SearchStrategy[ParallelConfig]:
    return ds.parallel_configs().flatmap(
        lambda c: st.integers(1, 4).map(lambda k: dataclasses.replace(c, gpus_per_node=c.tp * k))
    )


def tp_node_local(cfg: ParallelConfig, *, impl: Callable[[ParallelConfig, str], list[list[int]]] = _groups) -> None:
    """With TP innermost (Llama 3's order tp-cp-pp-dp) and tp | gpus_per_node, every TP
    group lies on one node (node = rank // gpus_per_node)."""
    for g in call_impl("groups", impl, cfg, "tp"):
        nodes = {r // cfg.gpus_per_node for r in g}
        if len(nodes) != 1:
            raise PropertyFailure(f"TP group {g} spans nodes {sorted(nodes)} for {cfg}", expected="one node",
                                  got=sorted(nodes))


def coords_bijection(cfg: ParallelConfig, *, impl: Callable[[ParallelConfig, int], dict[str, int]] = _coords) -> None:
    """coords is a bijection from ranks onto the index grid, inverse to rank_of."""
    from distcheck.parallel.layout.reference import _world, rank_of

    seen = set()
    for rank in range(_world(cfg)):
        c = call_impl("coords", impl, cfg, rank)
        key = tuple(sorted(c.items()))
        if key in seen:
            raise PropertyFailure(f"coords not injective for {cfg}: rank {rank} repeats {c}")
        seen.add(key)
        for a, i in c.items():
            if not 0 <= i < cfg.degree(a):
                raise PropertyFailure(f"rank {rank}: index {a}={i} outside range({cfg.degree(a)}) for {cfg}")
        try:
            back = rank_of(cfg, **c)
        except ConfigError as e:
            raise PropertyFailure(f"rank_of rejects coords {c} of rank {rank}: {e}") from e
        if back != rank:
            raise PropertyFailure(f"rank_of(coords(rank)) for {cfg}", expected=rank, got=back)


def _configs() -> tuple[ParallelConfig, ...]:
    """tp 2, pp 2, dp 4 on nodes of 2 GPUs (each TP group fills a node), and tp 3, dp 2 on nodes
    of 3 GPUs (a tp that is not a power of two)."""
    from distcheck.parallel.layout.reference import ParallelConfig

    return (ParallelConfig(tp=2, pp=2, dp=4, gpus_per_node=2), ParallelConfig(tp=3, dp=2, gpus_per_node=3))


register(Property("layout.groups.partition", lambda: ds.parallel_configs(max_world_size=128, any_order=True),
                  groups_partition, "each rank in exactly one group per axis; group sizes = degrees",
                  _groups, "groups(cfg, axis) -> list[list[int]]", _configs))
register(Property("layout.tp.node_local", _node_local_configs, tp_node_local,
                  "tp-innermost order and tp | gpus_per_node: every TP group on one node",
                  _groups, "groups(cfg, axis) -> list[list[int]]", _configs))
register(Property("layout.coords.bijection", lambda: ds.parallel_configs(max_world_size=128, any_order=True),
                  coords_bijection, "coords <-> rank_of is a bijection onto the index grid",
                  _coords, "coords(cfg, rank) -> dict[str, int]", _configs))
