"""Reference for the rank layout of 3D/4D parallelism (tp, cp, pp, dp, and ep).

A world of ``world_size`` ranks is a grid with one axis per parallelism. The
axis *order* is listed innermost first: the innermost axis varies fastest as
the rank grows, so its groups are runs of consecutive ranks (and land on one
node when the degree divides ``gpus_per_node``). Llama 3 405B orders the axes
``[TP, CP, PP, DP]`` innermost to outermost (Dubey et al. 2024, §3.3.2), which is
the default here.

Correspondence with ``torch.distributed.device_mesh``: ``init_device_mesh``
lays ranks out as ``arange(world_size).reshape(mesh_shape)`` (row-major), so
its *last* dimension is the innermost. The mesh that reproduces a config is::

    init_device_mesh(device, mesh_shape(cfg), mesh_dim_names=mesh_dim_names(cfg))

with both tuples outermost first, e.g. ``("dp", "pp", "cp", "tp")`` for the
default order, and ``groups(cfg, axis)`` lists exactly the rank groups that
mesh creates for dimension ``axis``. picotron's grid
``arange(world).view(dp, pp, cp, tp)`` is the same layout.

Expert parallelism has two placements (``ep_placement``):

- ``"inside_dp"`` (default; Megatron-core's placement with expert tp = tp,
  :data:`distcheck.parallel.layout.EP_PLACEMENT_MEGATRON`): experts are sharded across the
  dp*cp ranks of one model replica position, outside tp; ``ep`` must divide
  ``dp*cp`` and the world size does not change. torchtitan borrows ep from the
  tp ranks too (:data:`distcheck.parallel.layout.EP_PLACEMENT_TORCHTITAN`,
  :func:`distcheck.parallel.layout.torchtitan_layout`): a different placement as soon as tp > 1.
  ep is then not an axis of the mesh; its groups are described at :func:`groups`.
- ``"outside"``: ep is its own mesh axis and ``world_size = tp*cp*pp*dp*ep``.

Everything here is numpy (no torch, no sympy); groups of a 16,384-rank world
are built with one ``arange/reshape/transpose``.

Sizes: :func:`coords`, :func:`rank_of`, :func:`node_of`, :func:`mesh_shape` and
``ParallelConfig.num_groups`` are O(1) arithmetic and work for any world size.
The functions that enumerate every rank (:func:`rank_grid`, :func:`groups`,
:func:`groups_node_local`, :func:`tp_groups_node_local`) require
``world_size <= MAX_RANKS`` (2**24 = 16,777,216, :data:`distcheck.core.validate.MAX_RANKS`)
and raise ConfigError beyond it. Every function raises ConfigError when ``cfg``
is not a :class:`ParallelConfig`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from math import prod
from typing import Any

import numpy as np

from distcheck.core.errors import ConfigError
from distcheck.core.validate import MAX_RANKS, check_choice, check_positive_int
from distcheck.core.vocab import LAYOUT_ORDER, Axis

__all__ = [
    "AXES",
    "DEFAULT_ORDER",
    "EP_PLACEMENTS",
    "ParallelConfig",
    "mesh_axes",
    "mesh_shape",
    "mesh_dim_names",
    "coords",
    "rank_of",
    "rank_grid",
    "groups",
    "node_of",
    "groups_node_local",
    "tp_groups_node_local",
    "EXAMPLES",
    "MAX_RANKS",
]

#: every axis name a config knows: the layout order's four and ep
AXES = tuple(axis.value for axis in (*LAYOUT_ORDER, Axis.EP))
#: Llama 3's order, innermost first (Dubey et al. 2024, §3.3.2)
DEFAULT_ORDER = tuple(axis.value for axis in LAYOUT_ORDER)
#: where the ep ranks come from: carved out of dp x cp ("inside_dp"), or an axis of their own ("outside")
EP_PLACEMENTS = ("inside_dp", "outside")


def _parse_order(order: Any) -> tuple[str, ...]:  # user input: a string or a sequence of axis names
    if isinstance(order, str):
        parts = tuple(p.strip() for p in order.replace(",", "-").split("-"))
    else:
        try:
            parts = tuple(order)
        except TypeError:
            raise ConfigError("order", order,
                              "must be a sequence of axis names or a string like 'tp-cp-pp-dp'") from None
    for p in parts:
        if not isinstance(p, str) or p not in AXES:
            raise ConfigError("order", order, f"names an unknown axis {p!r} (axes: {', '.join(AXES)})")
    dup = sorted({p for p in parts if parts.count(p) > 1})
    if dup:
        raise ConfigError("order", order, f"repeats axis {', '.join(dup)}")
    return parts


@dataclass(frozen=True)
class ParallelConfig:
    """The degrees of each parallelism and how ranks are laid out.

    Arguments (every degree a positive int; bools rejected):

    - ``tp``, ``pp``, ``dp``, ``cp``, ``ep``: tensor-, pipeline-, data-, context-
      and expert-parallel degrees, default 1.
    - ``gpus_per_node``: GPUs per server (default 8), used by :func:`node_of`.
    - ``world_size``: optional; if given it must equal the product of the mesh
      degrees (``tp*cp*pp*dp``, times ``ep`` when ``ep_placement="outside"``).
      After construction it always holds that product.
    - ``order``: the mesh axes innermost first, as a tuple (``("tp", "cp",
      "pp", "dp")``) or a string (``"tp-cp-pp-dp"``). ``None`` (default) means
      Llama 3's ``tp, cp, pp, dp``, followed by ``ep`` when ep is outside.
      Any permutation is allowed; an axis of degree 1 may be left out (it is
      appended outermost); an axis of degree > 1 may not. With
      ``ep_placement="outside"`` ``ep`` is a mesh axis like the others. With
      ``"inside_dp"`` it is not, but Megatron-core's order strings name it
      (``"tp-cp-ep-dp-pp"``): it is accepted and dropped when ``ep == 1`` or
      when it sits inside ``dp``, where the ep groups are carved (see
      :func:`groups`), and refused outside ``dp``. Stored normalised as a
      tuple of every mesh axis.
    - ``ep_placement``: ``"inside_dp"`` (ep must divide ``dp*cp``) or ``"outside"``.

    Raises ConfigError naming the field, its value and the rule, e.g.
    ``world_size=100 must equal tp*cp*pp*dp = 8*1*4*2 = 64``.

    Sources: Narayanan et al. 2021 §3.1 (``p*t*d = n``); Llama 3 §3.3.2
    (order [TP, CP, PP, DP], Table 4); the lesson "Scaling and distributed training" ("3D parallelism").

    >>> ParallelConfig(tp=8, pp=16, dp=128).world_size
    16384
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    gpus_per_node: int = 8
    world_size: int | None = None
    order: tuple[str, ...] | str | None = None
    ep_placement: str = "inside_dp"

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "ep", "gpus_per_node"):
            check_positive_int(name, getattr(self, name))
        check_choice("ep_placement", self.ep_placement, EP_PLACEMENTS)
        axes = mesh_axes(self)
        if self.ep_placement == "inside_dp":
            data = self.dp * self.cp
            if data % self.ep != 0:
                raise ConfigError("ep", self.ep,
                                  f"must divide dp*cp = {self.dp}*{self.cp} = {data} (ep_placement='inside_dp')")
        product = prod(self.degree(a) for a in axes)
        if self.world_size is not None:
            check_positive_int("world_size", self.world_size)
            if self.world_size != product:
                names = "*".join(axes)
                values = "*".join(str(self.degree(a)) for a in axes)
                raise ConfigError("world_size", self.world_size, f"must equal {names} = {values} = {product}")
        object.__setattr__(self, "world_size", product)
        object.__setattr__(self, "order", self._normalise_order(axes))

    def _normalise_order(self, axes: tuple[str, ...]) -> tuple[str, ...]:
        if self.order is None:
            return DEFAULT_ORDER + (("ep",) if self.ep_placement == "outside" else ())
        given = _parse_order(self.order)
        if Axis.EP in given and Axis.EP not in axes:
            # Megatron-core's order strings ("tp-cp-ep-dp-pp") name ep with ep_placement='inside_dp':
            # a size-1 ep, or an ep carved from dp*cp, which must then sit inside dp (innermost first)
            if self.ep > 1 and (Axis.DP not in given or given.index(Axis.EP) > given.index(Axis.DP)):
                raise ConfigError("order", self.order, f"places ep outside dp, but ep={self.ep} is carved from the "
                                  "dp*cp ranks (ep_placement='inside_dp'); put ep inside dp (e.g. 'tp-cp-ep-dp-pp') "
                                  "or use ep_placement='outside'")
            given = tuple(a for a in given if a != Axis.EP)
        for a in given:
            if a not in axes:
                raise ConfigError("order", self.order,
                                  f"names {a!r}, which is not a mesh axis here (mesh axes: {', '.join(axes)}; "
                                  "ep is a mesh axis only with ep_placement='outside')")
        for a in axes:
            if a not in given and self.degree(a) > 1:
                raise ConfigError("order", self.order, f"must list {a!r} ({a}={self.degree(a)} > 1)")
        return given + tuple(a for a in axes if a not in given)

    def degree(self, axis: str) -> int:
        """The degree of ``axis`` (one of tp, cp, pp, dp, ep); ConfigError otherwise."""
        check_choice("axis", axis, AXES)
        return getattr(self, axis)

    def num_groups(self, axis: str) -> int:
        """How many ``axis`` groups the world has: ``world_size // degree(axis)``."""
        return _world(self) // self.degree(axis)

    @property
    def weights_fraction_per_gpu(self) -> Fraction:
        """Fraction of the (dense) weights each GPU holds: ``1/(tp*pp)``.

        TP splits every layer's matrices and PP splits the layers; dp (and cp)
        replicate. Sharding over dp (ZeRO-3/FSDP) is not counted here.
        Source: the lesson "Scaling and distributed training" ("3D parallelism"): 1/128 for tp=8, pp=16.
        """
        return Fraction(1, self.tp * self.pp)


def _world(cfg: ParallelConfig) -> int:
    """``cfg.world_size``, which ``__post_init__`` always sets (to the product of the mesh degrees)."""
    assert cfg.world_size is not None, "ParallelConfig.__post_init__ sets world_size"
    return cfg.world_size


def _order(cfg: ParallelConfig) -> tuple[str, ...]:
    """``cfg.order``, which ``__post_init__`` always stores normalised (every mesh axis, innermost first)."""
    assert isinstance(cfg.order, tuple), "ParallelConfig.__post_init__ normalises order"
    return cfg.order


def _check_cfg(cfg: object) -> ParallelConfig:
    if not isinstance(cfg, ParallelConfig):
        raise ConfigError("cfg", cfg, "must be a ParallelConfig (see distcheck.parallel.layout.EXAMPLES)")
    return cfg


def _check_enumerable(cfg: ParallelConfig) -> None:
    if _world(cfg) > MAX_RANKS:
        raise ConfigError("world_size", cfg.world_size,
                          f"must be <= {MAX_RANKS} (2**24) to enumerate every rank; coords, rank_of, node_of "
                          "and ParallelConfig.num_groups work for any world size")


def mesh_axes(cfg: ParallelConfig) -> tuple[str, ...]:
    """The axes of the rank grid, canonical order: ``tp, cp, pp, dp`` (+ ``ep`` when outside)."""
    _check_cfg(cfg)
    return DEFAULT_ORDER + (("ep",) if cfg.ep_placement == "outside" else ())


def mesh_shape(cfg: ParallelConfig) -> tuple[int, ...]:
    """Degrees outermost first: the ``mesh_shape`` for ``init_device_mesh``."""
    _check_cfg(cfg)
    return tuple(cfg.degree(a) for a in reversed(_order(cfg)))


def mesh_dim_names(cfg: ParallelConfig) -> tuple[str, ...]:
    """Axis names outermost first: the ``mesh_dim_names`` for ``init_device_mesh``."""
    _check_cfg(cfg)
    return tuple(reversed(_order(cfg)))


def _strides(cfg: ParallelConfig) -> dict[str, int]:
    out, s = {}, 1
    for a in _order(cfg):
        out[a] = s
        s *= cfg.degree(a)
    return out


def coords(cfg: ParallelConfig, rank: int) -> dict[str, int]:
    """The index of ``rank`` along every mesh axis, e.g. ``{"tp": 3, "cp": 0, "pp": 1, "dp": 0}``.

    ``index[a] = (rank // stride[a]) % degree(a)`` where ``stride`` is the
    product of the degrees of the axes inner to ``a`` in ``cfg.order``.
    O(1) per axis, any world size. Raises ConfigError unless ``0 <= rank < world_size``.
    """
    _check_cfg(cfg)
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise ConfigError("rank", rank, "must be an integer")
    if not 0 <= rank < _world(cfg):
        raise ConfigError("rank", rank, f"must be in range(0, {cfg.world_size}) (world_size={cfg.world_size})")
    strides = _strides(cfg)
    return {a: (int(rank) // strides[a]) % cfg.degree(a) for a in mesh_axes(cfg)}


def rank_of(cfg: ParallelConfig, **index: int) -> int:
    """The rank at the given axis indices (inverse of :func:`coords`).

    Every mesh axis of degree > 1 must be given; an axis of degree 1 may be
    left out (index 0). Raises ConfigError for an unknown or missing axis or an
    index outside ``range(0, degree)``. O(1) per axis, any world size.
    """
    _check_cfg(cfg)
    axes = mesh_axes(cfg)
    for a, i in index.items():
        if a not in axes:
            raise ConfigError(a, i, f"is not a mesh axis (mesh axes: {', '.join(axes)})")
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ConfigError(a, i, "must be an integer")
        if not 0 <= i < cfg.degree(a):
            raise ConfigError(a, i, f"must be in range(0, {cfg.degree(a)}) ({a} degree = {cfg.degree(a)})")
    for a in axes:
        if a not in index and cfg.degree(a) > 1:
            raise ConfigError(a, None, f"is required ({a} degree = {cfg.degree(a)} > 1)")
    strides = _strides(cfg)
    return sum(int(index.get(a, 0)) * strides[a] for a in axes)


def rank_grid(cfg: ParallelConfig) -> np.ndarray:
    """``arange(world_size).reshape(mesh_shape(cfg))``: the ranks, axes outermost first.

    Raises ConfigError when ``world_size > MAX_RANKS`` (2**24).
    """
    _check_cfg(cfg)
    _check_enumerable(cfg)
    return np.arange(_world(cfg), dtype=np.int64).reshape(mesh_shape(cfg))


def _groups_array(cfg: ParallelConfig, axis: str) -> np.ndarray:
    """Groups as a 2-D array, one row per group, rows and entries ascending."""
    _check_cfg(cfg)
    check_choice("axis", axis, AXES)
    _check_enumerable(cfg)
    grid = rank_grid(cfg)
    if axis == "ep" and cfg.ep_placement == "inside_dp":
        # ep borrows from the dp*cp data ranks: flatten (dp, cp) with dp outer,
        # and split that flattened index into consecutive blocks of ep.
        names = list(mesh_dim_names(cfg))
        rest = [i for i, a in enumerate(names) if a not in ("dp", "cp")]
        moved = np.transpose(grid, rest + [names.index("dp"), names.index("cp")])
        rows = moved.reshape(-1, cfg.ep)
    else:
        k = mesh_dim_names(cfg).index(axis)
        rows = np.moveaxis(grid, k, -1).reshape(-1, cfg.degree(axis))
    rows = np.sort(rows, axis=1)
    return rows[np.argsort(rows[:, 0], kind="stable")]


def groups(cfg: ParallelConfig, axis: str) -> list[list[int]]:
    """The rank groups of ``axis``: ranks whose indices differ only along ``axis``.

    Returns ``num_groups(axis)`` lists of ``degree(axis)`` ranks each; each
    list ascending, the lists sorted by first rank. They equal the groups
    ``init_device_mesh(device, mesh_shape(cfg), mesh_dim_names=mesh_dim_names(cfg))``
    creates for dimension ``axis`` (see the module docstring).

    ``axis="ep"`` with ``ep_placement="inside_dp"``: the dp*cp ranks that share
    every other index are ordered by ``(dp index, cp index)`` (dp outer) and
    cut into consecutive blocks of ``ep``; each block is one expert-parallel
    group. This is Megatron-core's placement (expert tp = tp, default order), not
    torchtitan's, which takes the tp ranks into ep first (:func:`distcheck.parallel.layout.ep_placements`).
    Raises ConfigError for an unknown axis, or when
    ``world_size > MAX_RANKS`` (2**24; use ``cfg.num_groups(axis)`` and
    :func:`coords` / :func:`rank_of` for larger worlds).
    """
    return _groups_array(cfg, axis).tolist()


def node_of(cfg: ParallelConfig, rank: int) -> int:
    """The node (server) of ``rank``: ``rank // gpus_per_node`` (ranks fill nodes in order)."""
    coords(cfg, rank)  # range check
    return int(rank) // cfg.gpus_per_node


def groups_node_local(cfg: ParallelConfig, axis: str) -> bool:
    """True if every group of ``axis`` lies within one node of ``gpus_per_node`` GPUs.

    Works at any world size, without listing ranks: a group of a mesh axis is
    ``base + i*stride`` for ``i < degree``, where ``stride`` is the product of the degrees
    of the axes inside it in ``cfg.order``; it stays in one node iff
    ``base mod g + (degree-1)*stride < g`` (g = gpus_per_node). The bases are
    ``inner + k*stride*degree`` with ``inner < stride``, so only their residues mod g
    matter: at most g values of each, O(g**2) work. EP placed inside DP is checked by
    listing its groups (``world_size <= MAX_RANKS``).

    Raises ConfigError for a non-ParallelConfig or an unknown axis.
    """
    _check_cfg(cfg)
    check_choice("axis", axis, AXES)
    if axis == "ep" and cfg.ep_placement == "inside_dp":
        nodes = _groups_array(cfg, axis) // cfg.gpus_per_node
        return bool(np.all(nodes.min(axis=1) == nodes.max(axis=1)))
    g, d = cfg.gpus_per_node, cfg.degree(axis)
    if d == 1:
        return True
    stride = 1
    for a in _order(cfg):
        if a == axis:
            break
        stride *= cfg.degree(a)
    span = (d - 1) * stride
    if span >= g:  # (with degree >= 2 this also covers stride >= g)
        return False
    block = stride * d
    blocks = _world(cfg) // block
    step = g // math.gcd(block, g)  # k*block mod g repeats with this period
    residues = {(k * block) % g for k in range(min(blocks, step))}
    return all((r + inner) % g + span < g for r in residues for inner in range(stride))


def tp_groups_node_local(cfg: ParallelConfig) -> bool:
    """True if every TP group is inside one node (the lesson: TP needs NVLink-class links)."""
    return groups_node_local(cfg, "tp")


#: Worked layouts from the sources (inputs only; world sizes are computed)
EXAMPLES: dict[str, ParallelConfig] = {
    # the lesson "Scaling and distributed training" ("3D parallelism"): 8 x 16 x 128 = 16,384 GPUs,
    # 1/128 of the weights each
    "lesson.llama3_405b": ParallelConfig(tp=8, pp=16, dp=128),
    # "Chapter 26: Distributed Training" ("Putting It All Together"): DP=16 x TP=8 x PP=8 = 1,024
    "chapter.llama3_405b_1024": ParallelConfig(tp=8, pp=8, dp=16),
    # Llama 3 paper, Table 4 (order [TP, CP, PP, DP])
    "llama3.table4.8192": ParallelConfig(tp=8, cp=1, pp=16, dp=64),
    "llama3.table4.16384": ParallelConfig(tp=8, cp=1, pp=16, dp=128),
    "llama3.table4.16384_long_context": ParallelConfig(tp=8, cp=16, pp=16, dp=8),
}
