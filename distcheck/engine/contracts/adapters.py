"""Per-library set-up a rank does before it builds a target: :func:`prepare`.

Some libraries keep their tensor-parallel group in module state that must be initialised on every
rank before a layer is built. The target's top-level package (``fairscale`` for
``fairscale.nn.model_parallel.layers:ColumnParallelLinear``), or the library the names of the
target's module come from (a user's layer built from fairscale's), selects the set-up in
:data:`SETUPS`; any other target needs none.

* **fairscale** (``fairscale.nn.model_parallel``): ``initialize_model_parallel(tp)`` with tp = the
  world size, once per rank process (again only when the world size changed); its layers and
  ``vocab_parallel_cross_entropy`` then use that group. fairscale keeps the group in module
  globals, one per process, so the threaded backend (every rank a thread of one process) cannot
  host it: refused as a :class:`~distcheck.engine.contracts.errors.ProtocolError`.

torch and the library are imported inside the functions only.
"""

from __future__ import annotations

import contextlib
import io
import sys
import types
from collections.abc import Callable

from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import Target
from distcheck.engine.world import RankContext

__all__ = ["SETUPS", "library_of", "prepare"]


def _fairscale(ctx: RankContext, target: Target) -> None:
    if getattr(ctx, "backend", "") == "threaded":
        raise ProtocolError("target", target.ref, "is a fairscale layer: fairscale keeps its model-parallel group in "
                                                  "module globals, one per process; use a process backend "
                                                  "(--backend gloo or nccl), not threaded")
    from fairscale.nn.model_parallel import initialize as mpu

    key = "distcheck.fairscale.tp"
    if ctx.scratch.get(key) == ctx.world_size and mpu.model_parallel_is_initialized():
        return
    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its sizes on rank 0
        mpu.initialize_model_parallel(ctx.world_size)
    ctx.scratch[key] = ctx.world_size


#: top-level package of a target -> the set-up every rank runs before building it
SETUPS: dict[str, Callable] = {"fairscale": _fairscale}


def library_of(target: Target) -> str | None:
    """The library of :data:`SETUPS` the target belongs to, or None: the top-level package of its
    ``module:object`` reference (``fairscale.nn.model_parallel.layers:ColumnParallelLinear``), else
    the library a name of the target's module comes from (a user's module that builds its layer from
    fairscale's: ``from fairscale.nn.model_parallel.layers import ColumnParallelLinear``)."""
    module_name = target.ref.split(":", 1)[0]
    top = module_name.split(".", 1)[0]
    if top in SETUPS:
        return top
    module = sys.modules.get(module_name)
    for value in vars(module).values() if module is not None else ():
        origin = getattr(value, "__module__", None) if not isinstance(value, types.ModuleType) else value.__name__
        if isinstance(origin, str) and origin.split(".", 1)[0] in SETUPS:
            return origin.split(".", 1)[0]
    return None


def prepare(ctx: RankContext, target: Target) -> None:
    """Run the set-up of the target's library on this rank, if it has one (see the module doc)."""
    library = library_of(target)
    if library is not None:
        SETUPS[library](ctx, target)
