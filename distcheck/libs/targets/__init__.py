"""Adapters for the real libraries distcheck certifies, one module each.

Each adapter imports its library lazily (inside its functions), so importing this package
needs none of them. Every module has ``DIST`` (the PyPI distribution), ``TITLE`` and
``CERTIFY``: the module-level targets it defines with the contract each is certified under,
e.g. ``("ZERO2", "memory-estimator")``, so that ``distcheck certify
distcheck.libs.targets.deepspeed:ZERO2 --contract memory-estimator`` certifies one and
``distcheck libs`` certifies them all. A module may also have ``extra_rows(*, required)``:
rows that are not a certification (an estimator that cannot be imported at all: a skip naming
what to install, a FAIL when ``required``; :func:`distcheck.engine.findings.not_loaded`).
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from distcheck.engine.contracts.targets import distribution_version

__all__ = ["TARGETS", "target", "installed", "dist_version", "library"]

#: target name -> adapter module (distcheck.libs.targets.<module>)
TARGETS = {
    "deepspeed": "deepspeed",
    "accelerate": "accelerate",
    "megatron": "megatron",
    "torchtitan": "torchtitan",
}


def target(name: str) -> ModuleType:
    """The adapter module of target ``name`` (a key of :data:`TARGETS`). ConfigError for another name."""
    from distcheck.core.validate import check_choice

    check_choice("target", name, tuple(TARGETS))
    return import_module(f"distcheck.libs.targets.{TARGETS[name]}")


def dist_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, None when it is not installed."""
    return distribution_version(dist)


def installed(dist: str) -> bool:
    return dist_version(dist) is not None


def library(dist: str) -> str:
    """``"deepspeed 0.19.8"``: the distribution and its installed version, as the rows name it."""
    return f"{dist} {dist_version(dist) or 'not installed'}"
