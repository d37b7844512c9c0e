"""Which backends a rank pool can run, how many ranks and how long a step may take, decided in the parent.

* :data:`BACKENDS`, :data:`MAX_LOCAL_RANKS` and :data:`MAX_TIMEOUT_S`: the limits every runner
  and ``distcheck check`` apply;
* :func:`check_backend_available`: raise :class:`~distcheck.core.errors.BackendUnavailable` before
  anything starts when a backend cannot run here (NCCL without enough GPUs, a torch build
  without gloo);
* :func:`check_timeout`: a timeout argument as float seconds, or a ConfigError naming the field.

Importing this module does not import torch; :func:`check_backend_available` does.
"""

from __future__ import annotations

import argparse
import importlib
import threading

from distcheck.core.errors import BackendUnavailable, ConfigError
from distcheck.core.validate import check_choice, check_float

__all__ = ["BACKENDS", "MAX_LOCAL_RANKS", "MAX_TIMEOUT_S", "check_backend_available", "check_timeout"]

#: backends a RankPool can run
BACKENDS = ("gloo", "nccl", "threaded")

#: the longest timeout (seconds) a pool step, a pool start-up, a torchrun world and
#: ``distcheck check --timeout`` accept: one day. Longer waits are refused as bad input
#: (the platform's own limits, e.g. ``threading.TIMEOUT_MAX`` and ``select``'s, are far larger
#: than this on Linux but not everywhere).
MAX_TIMEOUT_S = min(86_400.0, threading.TIMEOUT_MAX)

#: the most ranks one host may run per backend: gloo forks a process per rank (each
#: imports torch and holds its own buffers), threaded runs a thread per rank in one
#: process. Larger layouts belong on the fake backend (distcheck.engine.fake).
MAX_LOCAL_RANKS = {"gloo": 64, "threaded": 1024}


def check_backend_available(backend: str, world_size: int) -> None:
    """Raise :class:`BackendUnavailable` unless ``backend`` can run ``world_size`` ranks here.

    Decided in the calling (parent) process, before anything is started: NCCL
    needs ``torch.cuda.device_count() >= world_size`` and an NCCL build; gloo
    needs a gloo build; the threaded backend needs torch's testing helpers.
    Imports torch. An unknown ``backend`` raises ConfigError.
    """
    check_choice("backend", backend, BACKENDS)
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:  # pragma: no cover - torch is a declared extra
        raise BackendUnavailable(f"backend {backend!r} needs torch: {exc}") from None
    if not dist.is_available():
        raise BackendUnavailable("this torch build has no torch.distributed")
    if backend == "gloo" and not dist.is_gloo_available():
        raise BackendUnavailable("this torch build has no gloo backend")
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise BackendUnavailable("this torch build has no NCCL backend")
        if not torch.cuda.is_available():
            raise BackendUnavailable("backend 'nccl' needs CUDA GPUs; none is visible")
        have = torch.cuda.device_count()
        if have < world_size:
            raise BackendUnavailable(f"backend 'nccl' needs world_size={world_size} GPUs; {have} visible")
    if backend == "threaded":
        try:
            importlib.import_module("torch.testing._internal.distributed.multi_threaded_pg")
        except Exception as exc:  # noqa: BLE001 - any import failure means unavailable
            raise BackendUnavailable(f"threaded backend unavailable: {exc}") from None


def check_timeout(field: str, value: object) -> float:
    """``value`` as float seconds: a real number (bools rejected), finite, ``> 0`` and
    ``<= MAX_TIMEOUT_S`` (one day). Raises ConfigError naming ``field`` otherwise."""
    return check_float(field, value, gt=0.0, max_value=MAX_TIMEOUT_S, why="seconds: one day at most")


def timeout_seconds(text: str) -> float:
    """argparse type of ``--timeout``: seconds, finite, > 0 and at most ``MAX_TIMEOUT_S`` (one day)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    try:
        return check_timeout("--timeout", value)
    except ConfigError:
        raise argparse.ArgumentTypeError(
            f"expected a positive, finite number of seconds <= {MAX_TIMEOUT_S:g} (one day), got {text!r}") from None
