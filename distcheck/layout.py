"""3D parallel layouts (ParallelConfig, coordinates, rank groups, node locality) and layouts over any
named axes (foreign order strings, HSDP's split dp, borrowed ep, Megatron-core's and torchtitan's
layouts): public path of :mod:`distcheck.parallel.layout.reference` and
:mod:`distcheck.parallel.layout.mesh`."""

from distcheck.parallel.layout.mesh import *  # noqa: F403
from distcheck.parallel.layout.mesh import __all__ as _mesh_all
from distcheck.parallel.layout.reference import *  # noqa: F403
from distcheck.parallel.layout.reference import __all__ as _reference_all

__all__ = [*_reference_all, *_mesh_all]
