"""3D parallel layouts: how tp x cp x pp x dp ranks (and ep carved out of dp x cp) map onto a
world of GPUs.

- ``reference``: ``ParallelConfig`` (degrees, order, GPUs per node), coordinates and ranks,
  the rank grid, the rank groups of each axis, node locality;
- ``forms``: world size, group counts, coordinates, the fraction of the weights a GPU holds;
- ``strategies``: valid configs, and configs that break exactly one rule;
- ``properties``: groups partition the world, TP groups stay on a node, coords <-> rank is a
  bijection;
- ``mutants``: the mesh order reversed (TP groups across nodes).

Sources: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (arXiv:2104.04473); Llama Team 2024, "The Llama 3 Herd of
Models" (arXiv:2407.21783), §3.3.2 and Table 4 (the order tp, cp, pp, dp).

Public paths: :mod:`distcheck.layout`, :mod:`distcheck.forms.layout`, :mod:`distcheck.props.layout`.
"""
