"""Reference for rank layouts over any named axes: foreign order strings, split dp, borrowed ep.

:mod:`distcheck.parallel.layout.reference` (public path :mod:`distcheck.parallel.layout`) holds the
layout of one fixed set of axes (tp, cp, pp, dp, ep). Frameworks lay ranks out over other
axes and name them in their own order strings: Megatron-core's ``RankGenerator`` takes ``"tp-cp-ep-dp-pp"``,
torchtitan's ``ParallelDims`` splits dp into ``dp_replicate`` and ``dp_shard``
(HSDP) and builds its mesh ``(pp, dp_replicate, dp_shard, cp, tp)``, outermost
first. This module states those layouts from first principles:

- An :class:`AxisLayout` is a list of named axes with their degrees, innermost
  first. Rank ``r`` has index ``(r // stride[a]) % degree[a]`` on axis ``a``,
  where ``stride[a]`` is the product of the degrees inside ``a`` (as in
  :func:`distcheck.parallel.layout.coords`). ``init_device_mesh(device, shape, names)``
  builds the same layout with both tuples reversed (outermost first).
- :meth:`AxisLayout.groups` gives the groups of one axis or of several at once
  (``"tp-pp"``, ``"dp-cp"``): the ranks whose indices differ only along those
  axes.
- :meth:`AxisLayout.blocks` gives the groups of an axis *borrowed* from others,
  as expert parallelism is: the index over ``host`` axes (flattened, innermost
  first) is cut into consecutive blocks of ``size``; ranks in one block, with
  every other index equal, form a group. :meth:`AxisLayout.strided` gives the
  complementary groups (the same position in every block).
- :func:`derive_degree` states the ``-1`` sentinel some frameworks accept for
  one degree: the world size divided by the product of the others, which must
  divide it.

The framework layouts (:func:`megatron_layout`, :func:`torchtitan_layout`) map a
framework's configuration onto these objects: which order, which degrees,
which axes ep borrows from. They are the layouts the libraries *document*
(Megatron-core ``parallel_state`` and ``RankGenerator``; torchtitan
``ParallelDims.build_mesh``), written here without their code, so that the
rank-layout contract (:mod:`distcheck.parallel.layout.contracts`) can compare
what the libraries build with them.

Axis names come from :class:`distcheck.core.vocab.Axis` (tp, cp, pp, dp, ep and
torchtitan's dp_replicate, dp_shard); an :class:`AxisLayout` takes any identifier.
Public path: :mod:`distcheck.parallel.layout`.

Everything is numpy; enumerating functions require ``world_size <= MAX_RANKS``
(2**24). Bad input raises ConfigError naming the field, its value and the rule:
a degree that is not a positive integer, a repeated or unknown axis in an order
string, an axis of degree > 1 missing from the order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod

import numpy as np

from distcheck.core.errors import ConfigError
from distcheck.core.validate import MAX_RANKS, check_positive_int, check_type
from distcheck.core.vocab import Axis

__all__ = [
    "AxisLayout",
    "parse_order",
    "derive_degree",
    "MEGATRON_DEFAULT_ORDER",
    "TORCHTITAN_DENSE_ORDER",
    "MegatronLayout",
    "megatron_layout",
    "TorchtitanLayout",
    "torchtitan_layout",
    "EP_PLACEMENT_MEGATRON",
    "EP_PLACEMENT_TORCHTITAN",
    "ep_placements",
]

#: Megatron-core's default ``order`` of ``initialize_model_parallel`` (innermost first): "tp-cp-ep-dp-pp"
MEGATRON_DEFAULT_ORDER = "-".join((Axis.TP, Axis.CP, Axis.EP, Axis.DP, Axis.PP))
#: torchtitan's dense mesh ``(pp, dp_replicate, dp_shard, cp, tp)`` written innermost first
TORCHTITAN_DENSE_ORDER = "-".join((Axis.TP, Axis.CP, Axis.DP_SHARD, Axis.DP_REPLICATE, Axis.PP))


def parse_order(order: str | Sequence[str], field: str = "order") -> tuple[str, ...]:
    """An order string (``"tp-cp-ep-dp-pp"``, also with commas) or a sequence of axis names, as a
    tuple, innermost first. Raises ConfigError for an empty order, a name that is not an
    identifier, or an axis named twice (``"tp-tp-dp"``)."""
    if isinstance(order, str):
        parts = tuple(p.strip().lower() for p in order.replace(",", "-").split("-"))
    elif isinstance(order, (list, tuple)):
        parts = tuple(order)
    else:
        raise ConfigError(field, order, "must be a string like 'tp-cp-ep-dp-pp' or a sequence of axis names")
    if not parts or any(not isinstance(p, str) or not p.isidentifier() for p in parts):
        raise ConfigError(field, order, "must name axes (identifiers such as tp, dp_shard) separated by '-'")
    dup = sorted({p for p in parts if parts.count(p) > 1})
    if dup:
        raise ConfigError(field, order, f"repeats axis {', '.join(dup)}")
    return parts


def derive_degree(world_size: int, **others: int) -> int:
    """The degree that a ``-1`` sentinel stands for: ``world_size / prod(others)``.

    torchtitan's ``data_parallel_shard_degree = -1`` means "whatever is left of the
    world"; so does a planner's "dp = GPUs / (tp x pp)". Raises ConfigError when a
    degree is not a positive integer or the product does not divide ``world_size``.

    >>> derive_degree(64, tp=8, pp=2)
    4
    """
    check_positive_int("world_size", world_size)
    for name, d in others.items():
        check_positive_int(name, d)
    rest = prod(others.values())
    if world_size % rest:
        names = "*".join(others) or "1"
        raise ConfigError("world_size", world_size,
                          f"must be a multiple of {names} = {rest} to derive the remaining degree")
    return world_size // rest


@dataclass(frozen=True)
class AxisLayout:
    """Named axes with their degrees, innermost first (see the module docstring).

    Build it with :meth:`from_order`. ``axes`` and ``degrees`` are aligned tuples.
    """

    axes: tuple[str, ...]
    degrees: tuple[int, ...]

    def __post_init__(self) -> None:
        check_type("axes", self.axes, tuple, "must be a tuple of axis names (use AxisLayout.from_order)")
        check_type("degrees", self.degrees, tuple, "must be a tuple of degrees (use AxisLayout.from_order)")
        parse_order(self.axes, "axes")
        if len(self.axes) != len(self.degrees):
            raise ConfigError("degrees", self.degrees, f"must give one degree per axis ({len(self.axes)} axes)")
        for a, d in zip(self.axes, self.degrees, strict=True):
            check_positive_int(a, d)

    @classmethod
    def from_order(cls, order: str | Sequence[str], degrees: Mapping[str, int] | None = None, *,
                   world_size: int | None = None, **kw: int) -> AxisLayout:
        """The layout of ``degrees`` (a mapping, or keywords) under ``order`` (innermost first).

        Every axis the order names needs a degree. An axis with a degree but missing from the
        order is allowed when its degree is 1 (it is appended outermost, as Megatron-core does)
        and refused otherwise. ``world_size``, when given, must equal the product.

        >>> AxisLayout.from_order("tp-cp-ep-dp-pp", tp=2, cp=1, ep=1, dp=2, pp=2).groups("dp")
        [[0, 2], [1, 3], [4, 6], [5, 7]]
        """
        given = dict(degrees or {}, **kw)
        names = parse_order(order)
        for a in names:
            if a not in given:
                raise ConfigError("order", order,
                                  f"names axis {a!r}, which has no degree (degrees: {', '.join(given) or 'none'})")
        for a, d in given.items():
            check_positive_int(a, d)
            if a not in names and d > 1:
                raise ConfigError("order", order, f"must list {a!r} ({a}={d} > 1)")
        axes = names + tuple(a for a in given if a not in names)
        out = cls(axes, tuple(int(given[a]) for a in axes))
        if world_size is not None:
            check_positive_int("world_size", world_size)
            if world_size != out.world_size:
                shown = "*".join(f"{a}" for a in axes)
                raise ConfigError("world_size", world_size, f"must equal {shown} = {out.world_size}")
        return out

    @property
    def world_size(self) -> int:
        return prod(self.degrees)

    @property
    def order(self) -> str:
        """The order string, innermost first: ``"tp-cp-dp-pp"``."""
        return "-".join(self.axes)

    def degree(self, axis: str) -> int:
        """The degree of ``axis``; ConfigError for an axis the layout does not have."""
        return self.degrees[self._index(axis)]

    def stride(self, axis: str) -> int:
        """Product of the degrees inside ``axis``: how far apart its neighbours are."""
        return prod(self.degrees[: self._index(axis)])

    def coords(self, rank: int) -> dict[str, int]:
        """The index of ``rank`` on every axis. ConfigError unless ``0 <= rank < world_size``."""
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.world_size:
            raise ConfigError("rank", rank, f"must be an integer in range(0, {self.world_size})")
        return {a: (int(rank) // self.stride(a)) % self.degree(a) for a in self.axes}

    def _index(self, axis: str) -> int:
        if axis not in self.axes:
            raise ConfigError("axis", axis, f"is not an axis of this layout (axes: {', '.join(self.axes)})")
        return self.axes.index(axis)

    def _grid(self) -> np.ndarray:
        if self.world_size > MAX_RANKS:
            raise ConfigError("world_size", self.world_size, f"must be <= {MAX_RANKS} (2**24) to enumerate every rank")
        # row-major: the last numpy dimension is the innermost axis
        return np.arange(self.world_size, dtype=np.int64).reshape(tuple(reversed(self.degrees)))

    def _dims(self, axes: str | Sequence[str], field: str) -> list[int]:
        names = parse_order(axes, field)
        idx = [self._index(a) for a in names]
        n = len(self.axes)
        return [n - 1 - i for i in idx]  # numpy dimension of each axis

    @staticmethod
    def _canonical(rows: np.ndarray) -> list[list[int]]:
        rows = np.sort(rows, axis=1)
        return rows[np.argsort(rows[:, 0], kind="stable")].tolist()

    def groups(self, axes: str | Sequence[str]) -> list[list[int]]:
        """The groups of one axis or several (``"tp"``, ``"tp-pp"``, ``("dp", "cp")``): ranks whose
        indices differ only along ``axes``. Each group ascending, groups sorted by first rank.
        ConfigError for an unknown or repeated axis, or ``world_size > MAX_RANKS``."""
        dims = self._dims(axes, "axes")
        grid = self._grid()
        rest = [d for d in range(grid.ndim) if d not in dims]
        size = prod(grid.shape[d] for d in dims)
        return self._canonical(np.transpose(grid, rest + sorted(dims)).reshape(-1, size))

    def _host_rows(self, host: str | Sequence[str], size: int) -> np.ndarray:
        dims = self._dims(host, "host")
        check_positive_int("size", size)
        grid = self._grid()
        total = prod(grid.shape[d] for d in dims)
        if total % size:
            raise ConfigError("size", size,
                              f"must divide the product of the host axes ({'*'.join(parse_order(host))} = {total})")
        rest = [d for d in range(grid.ndim) if d not in dims]
        # host axes last, outermost first, so that the flattened host index is innermost-first
        return np.transpose(grid, rest + sorted(dims)).reshape(-1, total // size, size)

    def blocks(self, host: str | Sequence[str], size: int) -> list[list[int]]:
        """Groups of an axis of ``size`` borrowed from the ``host`` axes: their flattened index
        (innermost first) cut into consecutive blocks of ``size``, every other index fixed.
        ConfigError unless ``size`` divides the product of the host degrees."""
        rows = self._host_rows(host, size)
        return self._canonical(rows.reshape(-1, size))

    def strided(self, host: str | Sequence[str], size: int) -> list[list[int]]:
        """The complement of :meth:`blocks`: ranks at the same position of every block (the
        data-parallel groups of the experts, for instance)."""
        rows = self._host_rows(host, size)
        return self._canonical(np.swapaxes(rows, 1, 2).reshape(-1, rows.shape[1]))


# ----------------------------------------------------------------------------- Megatron-core


@dataclass(frozen=True)
class MegatronLayout:
    """Megatron-core's two layouts: ``dense`` (attention and dense layers: tp, cp, dp, pp; ep of
    size 1) and ``expert`` (MoE layers: expert tp, ep, expert dp, pp; cp of size 1), both under the
    same order string. ``groups(token)`` reads a token like ``RankGenerator.get_ranks``: dense
    axes by default, ``expert=True`` for the expert layout."""

    dense: AxisLayout
    expert: AxisLayout

    def groups(self, token: str, *, expert: bool = False) -> list[list[int]]:
        return (self.expert if expert else self.dense).groups(token)


def megatron_layout(*, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, etp: int | None = None,
                    world_size: int | None = None, dp: int | None = None,
                    order: str = MEGATRON_DEFAULT_ORDER) -> MegatronLayout:
    """The rank layout Megatron-core documents for ``initialize_model_parallel``.

    dp is derived from the world size (``world_size / (tp pp cp)``) when not given; the
    expert layout has expert tp ``etp`` (default ``tp``), ``ep`` and expert dp
    ``world_size / (etp ep pp)``, cp of size 1, under the same ``order``. With the default
    order and ``etp == tp`` the ep groups are consecutive blocks of ep ranks of the dp*cp data
    ranks (cp inner), which is :mod:`distcheck.parallel.layout`'s ``ep_placement="inside_dp"``.
    Source: Megatron-core ``parallel_state.initialize_model_parallel`` and ``RankGenerator``
    (docstring of ``generate_masked_orthogonal_rank_groups``: rank = tp_rank + dp_rank*tp + ...).
    Raises ConfigError for non-positive degrees, an order missing an axis of degree > 1,
    a repeated axis, or degrees that do not divide the world.
    """
    for name, v in ((Axis.TP, tp), (Axis.PP, pp), (Axis.CP, cp), (Axis.EP, ep)):
        check_positive_int(name, v)
    etp = tp if etp is None else check_positive_int("etp", etp)
    if world_size is None and dp is None:
        raise ConfigError("world_size", None, "is required when dp is not given")
    if dp is None:
        dp = derive_degree(world_size, tp=tp, pp=pp, cp=cp)  # type: ignore[arg-type]
    check_positive_int(Axis.DP, dp)
    world = tp * pp * cp * dp
    if world_size is not None and world_size != world:
        raise ConfigError("world_size", world_size, f"must equal tp*pp*cp*dp = {tp}*{pp}*{cp}*{dp} = {world}")
    edp = derive_degree(world, etp=etp, ep=ep, pp=pp)
    dense = AxisLayout.from_order(order, tp=tp, cp=cp, ep=1, dp=dp, pp=pp)
    expert = AxisLayout.from_order(order, tp=etp, cp=1, ep=ep, dp=edp, pp=pp)
    return MegatronLayout(dense, expert)


# ----------------------------------------------------------------------------- torchtitan


@dataclass(frozen=True)
class TorchtitanLayout:
    """torchtitan's dense layout (``pp, dp_replicate, dp_shard, cp, tp``, outermost first) and its
    expert layout: ep borrowed from the ``tp, cp, dp_shard`` ranks (innermost first) in blocks of
    ep, efsdp the strided complement. :meth:`groups` takes torchtitan's mesh names."""

    dense: AxisLayout
    ep: int

    #: torchtitan mesh name -> the dense axes it spans (batch, dp, loss and fsdp are torchtitan's flattened meshes)
    SPANS = {**{a.value: (a,) for a in (Axis.PP, Axis.DP_REPLICATE, Axis.DP_SHARD, Axis.CP, Axis.TP)},
             "batch": (Axis.DP_SHARD, Axis.DP_REPLICATE), Axis.DP.value: (Axis.DP_SHARD, Axis.DP_REPLICATE),
             "loss": (Axis.CP, Axis.DP_SHARD, Axis.DP_REPLICATE), "fsdp": (Axis.CP, Axis.DP_SHARD)}
    #: the axes expert parallelism borrows from, innermost first
    EP_HOST = (Axis.TP, Axis.CP, Axis.DP_SHARD)
    #: the expert mesh's names: ep, and efsdp (the strided complement of ep over the host axes)
    EXPERT = (Axis.EP.value, "efsdp")

    def groups(self, name: str) -> list[list[int]]:
        """The groups of mesh ``name``: pp, dp_replicate, dp_shard, cp, tp, batch (= dp), loss, fsdp,
        ep or efsdp. ConfigError for another name."""
        ep_name, efsdp_name = self.EXPERT
        if name == ep_name:
            return self.dense.blocks(self.EP_HOST, self.ep)
        if name == efsdp_name:
            return self.dense.strided(self.EP_HOST, self.ep)
        if name not in self.SPANS:
            raise ConfigError("name", name, f"must be one of {', '.join([*self.SPANS, *self.EXPERT])}")
        return self.dense.groups(self.SPANS[name])


def torchtitan_layout(*, dp_replicate: int = 1, dp_shard: int = -1, cp: int = 1, tp: int = 1, pp: int = 1,
                      ep: int = 1, world_size: int) -> TorchtitanLayout:
    """The layout torchtitan documents for ``ParallelDims(...).build_mesh()``.

    ``dp_shard = -1`` is derived: ``world_size / (dp_replicate cp tp pp)`` (:func:`derive_degree`).
    ep must divide ``dp_shard * cp * tp`` (the ranks it borrows). Source: torchtitan
    ``torchtitan/distributed/parallel_dims.py`` (``build_mesh``: dense mesh
    ``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``, sparse mesh ``["pp", "dp_replicate",
    "efsdp", "ep"]`` with ``efsdp = dp_shard * cp * tp / ep``). Raises ConfigError for a degree
    that is not a positive integer (``dp_shard`` may be -1), a product that is not the world size,
    or an ep that does not divide the ranks it borrows.
    """
    for name, v in ((Axis.DP_REPLICATE, dp_replicate), (Axis.CP, cp), (Axis.TP, tp), (Axis.PP, pp), (Axis.EP, ep)):
        check_positive_int(name, v)
    if dp_shard == -1:
        dp_shard = derive_degree(world_size, dp_replicate=dp_replicate, cp=cp, tp=tp, pp=pp)
    check_positive_int(Axis.DP_SHARD, dp_shard)
    dense = AxisLayout.from_order(TORCHTITAN_DENSE_ORDER, tp=tp, cp=cp, dp_shard=dp_shard, dp_replicate=dp_replicate,
                                  pp=pp, world_size=world_size)
    host = dp_shard * cp * tp
    if host % ep:
        raise ConfigError(Axis.EP, ep,
                          f"must divide dp_shard*cp*tp = {dp_shard}*{cp}*{tp} = {host} (the ranks ep borrows)")
    return TorchtitanLayout(dense, ep)


# ----------------------------------------------------------------------------- expert-parallel placements

#: Megatron-core's expert-parallel placement: the expert layout ``RankGenerator(tp=etp, ep, dp, pp, cp=1)`` under
#: ``tp-cp-ep-dp-pp`` numbers rank = etp_rank + etp·(ep_rank + ep·(edp_rank + edp·pp_rank)), so an ep group is
#: ranks etp apart: with etp = tp (its default) ep is cut from the dp·cp ranks and never holds two ranks of a tp group
EP_PLACEMENT_MEGATRON = "ep strided by tp over the dp·cp ranks, outside tp (Megatron-core)"
#: torchtitan's: the sparse mesh ``(pp, dp_replicate, efsdp, ep)`` unflattens the world with ep innermost, so an ep
#: group is ep consecutive ranks of the tp·cp·dp_shard block, tp innermost: ep takes the tp ranks first
EP_PLACEMENT_TORCHTITAN = "ep over consecutive tp·cp·dp_shard ranks, tp innermost (torchtitan)"


def ep_placements(*, tp: int, data: int, ep: int) -> dict[str, list[list[int]]]:
    """The ep groups of one stage of ``tp * data`` ranks (``data`` data-parallel ranks, no cp) under each named
    expert-parallel placement: :data:`EP_PLACEMENT_MEGATRON` (:func:`megatron_layout`'s expert layout, etp = tp)
    and :data:`EP_PLACEMENT_TORCHTITAN` (:func:`torchtitan_layout`, ``dp_shard = data``). The two differ whenever
    tp > 1 and ep > 1 (tp = data = ep = 2: ``[[0, 2], [1, 3]]`` against ``[[0, 1], [2, 3]]``). Raises ConfigError
    for a degree that is not a positive integer, or when ep does not divide ``data`` (Megatron) or ``tp * data``
    (torchtitan)."""
    for name, v in (("tp", tp), ("data", data), ("ep", ep)):
        check_positive_int(name, v)
    world = tp * data
    megatron = megatron_layout(tp=tp, dp=data, ep=ep, world_size=world)
    return {EP_PLACEMENT_MEGATRON: megatron.groups(Axis.EP, expert=True),
            EP_PLACEMENT_TORCHTITAN: torchtitan_layout(dp_shard=data, tp=tp, ep=ep, world_size=world).groups(Axis.EP)}
