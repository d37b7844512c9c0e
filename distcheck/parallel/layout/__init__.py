"""3D parallel layouts: how tp x cp x pp x dp ranks (and ep carved out of dp x cp) map onto a
world of GPUs.

- ``reference``: ``ParallelConfig`` (degrees, order, GPUs per node), coordinates and ranks,
  the rank grid, the rank groups of each axis, node locality (Megatron-core's order strings,
  ``"tp-cp-ep-dp-pp"``, accepted); ``mesh``: layouts over any named axes (foreign order
  strings, size-1 axes, HSDP's dp_replicate and dp_shard, groups of several axes, ep borrowed
  from other axes, a degree derived from the world size) and the layouts Megatron-core and
  torchtitan document;
- ``forms``: world size, group counts, coordinates, the fraction of the weights a GPU holds,
  dp derived from the world size (ep inside or outside dp);
- ``strategies``: valid configs, and configs that break exactly one rule;
- ``properties``: groups partition the world, TP groups stay on a node, coords <-> rank is a
  bijection;
- ``mutants``: the mesh order reversed (TP groups across nodes).

Sources: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (arXiv:2104.04473); Llama Team 2024, "The Llama 3 Herd of
Models" (arXiv:2407.21783), §3.3.2 and Table 4 (the order tp, cp, pp, dp); Megatron-core
``parallel_state.RankGenerator``; torchtitan ``ParallelDims.build_mesh``.

Public API: this package, ``distcheck.parallel.layout``: the names of ``__all__``, served on first
access from its internal modules (``reference``, ``mesh``). Every module inside the package is
internal; its closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "AXES", "DEFAULT_ORDER", "EP_PLACEMENTS", "ParallelConfig", "mesh_axes", "mesh_shape", "mesh_dim_names",
    "coords", "rank_of", "rank_grid", "groups", "node_of", "groups_node_local", "tp_groups_node_local",
    "EXAMPLES", "MAX_RANKS", "AxisLayout", "parse_order", "derive_degree", "MEGATRON_DEFAULT_ORDER",
    "TORCHTITAN_DENSE_ORDER", "MegatronLayout", "megatron_layout", "TorchtitanLayout", "torchtitan_layout",
    "EP_PLACEMENT_MEGATRON", "EP_PLACEMENT_TORCHTITAN", "ep_placements",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference", "mesh"))
