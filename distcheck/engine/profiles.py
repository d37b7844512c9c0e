"""Hypothesis settings profiles for distcheck's properties: ``dev``, ``ci``, ``thorough``.

- ``dev``: quick local feedback (25 examples, random seed, local example database).
- ``ci``: deterministic (``derandomize=True``), no database, 40 examples; all of
  ``properties/`` runs well under two minutes on two cores.
- ``thorough``: 400 examples, random seed, for nightly runs or before a release.

Properties on a real world (``distcheck check``'s DDP and layer stages, which run contracts
through a rank pool) take :data:`WORLD_MAX_EXAMPLES` examples per property instead: each
example there is a step of every rank (a DDP or FSDP2 wrapper built, a forward, a backward,
collectives), 10 to 100 ms on two cores against well under 1 ms for a reference property, so
``ci`` runs 10 and ``thorough`` 100 (``dev`` 10). Every edge a contract's strategy must reach
(unequal shards, a bias, tp not dividing a width) is in its strategy's reach at that count;
``distcheck certify`` itself takes the profile's full count unless ``--examples`` says otherwise.

Every profile prints the ``@reproduce_failure`` blob of a failure (``print_blob=True``)
and has no deadline (the references build numpy arrays and the pipeline simulator
walks whole schedules, so per-example time varies with the drawn sizes).

Selecting a profile:

- pytest: ``--distcheck-profile=NAME``, an option of distcheck's pytest plugin
  (:mod:`distcheck.pytest_plugin`). Nothing else selects one: a suite that does not
  ask keeps Hypothesis' own choice. This repository's ``properties/`` suite picks a
  default of its own (``properties/conftest.py``, :func:`default_profile_name`).
- CLI / library: ``distcheck check --profile NAME``, :func:`load_profile`, :func:`get_profile`.

Seeds: ``ci`` runs seed 0 (derandomized); ``dev`` and ``thorough`` draw a fresh seed unless one
is given. CI also runs one exploratory ``dev`` run whose seed is :func:`commit_seed` of the commit
under test, so every commit searches new examples and its run replays exactly.

In Hypothesis' registry the profiles are named ``distcheck-dev``, ``distcheck-ci`` and
``distcheck-thorough`` (:func:`hypothesis_name`). Hypothesis' own ``ci`` profile, which it
makes current on a CI machine, is never replaced: registering distcheck's profiles changes
nothing for a suite that does not load one. Importing this module does not import
Hypothesis; the profiles are registered on first use.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from distcheck.core.errors import ConfigError

if TYPE_CHECKING:
    from hypothesis import settings

__all__ = ["PROFILES", "WORLD_MAX_EXAMPLES", "DEFAULT_PROFILE", "hypothesis_name", "register_profiles", "load_profile",
           "get_profile", "default_profile_name", "commit_seed", "COMMIT_SEED_DIGITS"]

#: settings every profile shares: no deadline (first examples import sympy and torch),
#: and the @reproduce_failure blob printed with every failure
_COMMON = dict(deadline=None, print_blob=True, suppress_health_check=("too_slow",))

#: profile name -> keyword arguments of :class:`hypothesis.settings` (health checks by name)
PROFILES: dict[str, dict] = {
    "dev": dict(_COMMON, max_examples=25),
    "ci": dict(_COMMON, max_examples=40, derandomize=True, database=None),
    "thorough": dict(_COMMON, max_examples=400, suppress_health_check=("too_slow", "data_too_large")),
}

#: profile name -> Hypothesis examples per property of a contract run on a real world by ``distcheck check``
WORLD_MAX_EXAMPLES: dict[str, int] = {"dev": 10, "ci": 10, "thorough": 100}

#: the profile used when nothing selects one and CI is not set
DEFAULT_PROFILE = "dev"

_registered = False


def hypothesis_name(name: str) -> str:
    """The name Hypothesis knows profile ``name`` by: ``"distcheck-" + name``.

    Raises ConfigError for an unknown name.
    """
    return f"distcheck-{_check_name(name)}"


def register_profiles() -> None:
    """Register every profile of :data:`PROFILES` with Hypothesis, as :func:`hypothesis_name` (idempotent).

    Registering makes no profile current.
    """
    global _registered
    if not _registered:
        from hypothesis import HealthCheck, settings

        # parent = Hypothesis' pristine "default" profile, not the current one: under CI=true
        # Hypothesis makes its own "ci" profile current (derandomize=True, no database), and a
        # profile registered without a parent would silently inherit that (dev derandomized)
        base = settings.get_profile("default")
        for name, kwargs in PROFILES.items():
            checks = [HealthCheck[check] for check in kwargs["suppress_health_check"]]
            settings.register_profile(hypothesis_name(name), parent=base, **{**kwargs, "suppress_health_check": checks})
        _registered = True


def _check_name(name: object) -> str:
    if name not in PROFILES:
        raise ConfigError("profile", name, f"must be one of {', '.join(map(repr, PROFILES))}")
    return name


def get_profile(name: str) -> settings:
    """The :class:`hypothesis.settings` of profile ``name`` without making it current.

    Raises ConfigError for an unknown name.
    """
    from hypothesis import settings

    register_profiles()
    return settings.get_profile(hypothesis_name(name))


def load_profile(name: str) -> settings:
    """Register the profiles, make ``name`` Hypothesis' current profile and return its settings.

    Raises ConfigError("profile", name, ...) for an unknown name.
    """
    from hypothesis import settings

    register_profiles()
    settings.load_profile(hypothesis_name(name))
    return settings.get_profile(hypothesis_name(name))


def default_profile_name(env: Mapping[str, str] | None = None) -> str:
    """``HYPOTHESIS_PROFILE`` if set, else ``"ci"`` when ``CI`` is true-ish, else ``"dev"``.

    The default of this repository's own property suite (``properties/conftest.py``); the
    pytest plugin never applies it to another suite. Raises ConfigError when ``HYPOTHESIS_PROFILE``
    names an unknown profile.
    """
    env = os.environ if env is None else env
    chosen = env.get("HYPOTHESIS_PROFILE")
    if chosen:
        return _check_name(chosen)
    if env.get("CI", "").strip().lower() in ("1", "true", "yes"):
        return "ci"
    return DEFAULT_PROFILE


#: hex digits of a commit's object name that make its seed: 8, so the seed is a 32-bit integer
#: like the ones :func:`distcheck.props.resolve_seed` draws for ``dev`` and ``thorough``
COMMIT_SEED_DIGITS = 8

_OBJECT_NAME = re.compile(rf"[0-9a-f]{{{COMMIT_SEED_DIGITS},64}}")


def commit_seed(revision: str) -> int:
    """The seed of CI's exploratory ``dev`` run of a commit: the integer value of the first
    :data:`COMMIT_SEED_DIGITS` (8) hex digits of its object name, ``0 <= seed < 2**32``.

    ``revision`` is what ``git rev-parse HEAD`` prints (40 hex digits for SHA-1, 64 for SHA-256;
    an abbreviation of at least 8 digits gives the same seed), surrounding whitespace ignored,
    lowercase as git prints it. Each commit gets its own seed, so CI searches new examples on every
    commit, and ``distcheck check --profile dev --seed N`` replays a commit's run exactly.

    Raises ConfigError("revision", ...) when ``revision`` is not a str of 8 to 64 lowercase hex digits.
    """
    if not isinstance(revision, str) or not _OBJECT_NAME.fullmatch(revision.strip()):
        raise ConfigError("revision", revision,
                          f"must be a git object name: {COMMIT_SEED_DIGITS} to 64 lowercase hex digits "
                          "(what `git rev-parse HEAD` prints)")
    return int(revision.strip()[:COMMIT_SEED_DIGITS], 16)
