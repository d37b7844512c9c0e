"""Adapters for the real libraries distcheck certifies, one module each.

Each adapter imports its library lazily (inside its functions), so importing this
package needs none of them. Every module has ``DIST`` (the PyPI distribution),
``TITLE`` (the README row), ``CONTRACT`` and ``rows(max_examples, seed)``, which
returns the contract's :class:`distcheck.report.CheckResult` rows; the library's
absence is decided by :func:`distcheck.libs.targets.installed` before ``rows`` runs.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType

__all__ = ["TARGETS", "target", "installed", "dist_version"]

#: target name -> adapter module (distcheck.libs.targets.<module>)
TARGETS = {
    "deepspeed": "deepspeed",
    "accelerate": "accelerate",
    "megatron": "megatron",
    "torchtitan": "torchtitan",
}


def target(name: str) -> ModuleType:
    """The adapter module of target ``name`` (a key of :data:`TARGETS`)."""
    from distcheck.validate import check_choice

    check_choice("target", name, tuple(TARGETS))
    return import_module(f"distcheck.libs.targets.{TARGETS[name]}")


def dist_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, None when it is not installed."""
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def installed(dist: str) -> bool:
    return dist_version(dist) is not None
