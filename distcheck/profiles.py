"""Hypothesis settings profiles for distcheck's properties: ``dev``, ``ci``, ``thorough``.

- ``dev``: quick local feedback (25 examples, random seed, local example database).
- ``ci``: deterministic (``derandomize=True``), no database, 40 examples; all of
  ``properties/`` runs well under two minutes on two cores.
- ``thorough``: 400 examples, random seed, for nightly runs or before a release.

Every profile prints the ``@reproduce_failure`` blob of a failure (``print_blob=True``)
and has no deadline (the references build numpy arrays and the pipeline simulator
walks whole schedules, so per-example time varies with the drawn sizes).

Selecting a profile:

- pytest: ``pytest properties/ --distcheck-profile=thorough`` or the
  ``HYPOTHESIS_PROFILE`` environment variable; default ``ci`` when ``CI=true``,
  else ``dev`` (see ``properties/conftest.py``).
- CLI / library: :func:`load_profile` (``distcheck check --profile ci``).

Re-registering ``ci`` replaces Hypothesis' own built-in ``ci`` profile by design.
"""

from __future__ import annotations

import os
from typing import Mapping

from hypothesis import HealthCheck, settings

from distcheck.errors import ConfigError

__all__ = ["PROFILES", "DEFAULT_PROFILE", "register_profiles", "load_profile", "get_profile", "default_profile_name"]

#: settings every profile shares: no deadline (first examples import sympy and torch),
#: and the @reproduce_failure blob printed with every failure
_COMMON = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])

#: profile name -> keyword arguments of :class:`hypothesis.settings`
PROFILES: dict[str, dict] = {
    "dev": dict(_COMMON, max_examples=25),
    "ci": dict(_COMMON, max_examples=40, derandomize=True, database=None),
    "thorough": dict(_COMMON, max_examples=400,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]),
}

#: the profile used when nothing selects one and CI is not set
DEFAULT_PROFILE = "dev"

_registered = False


def register_profiles() -> None:
    """Register every profile of :data:`PROFILES` with Hypothesis (idempotent)."""
    global _registered
    if not _registered:
        # parent = Hypothesis' pristine "default" profile, not the current one: under CI=true
        # Hypothesis makes its own "ci" profile current (derandomize=True, no database), and a
        # profile registered without a parent would silently inherit that (dev derandomized)
        base = settings.get_profile("default")
        for name, kwargs in PROFILES.items():
            settings.register_profile(name, parent=base, **kwargs)
        _registered = True


def _check_name(name: object) -> str:
    if name not in PROFILES:
        raise ConfigError("profile", name, f"must be one of {', '.join(map(repr, PROFILES))}")
    return name  # type: ignore[return-value]


def get_profile(name: str) -> settings:
    """The :class:`hypothesis.settings` of profile ``name`` without making it current.

    Raises ConfigError for an unknown name.
    """
    register_profiles()
    return settings.get_profile(_check_name(name))


def load_profile(name: str) -> settings:
    """Register the profiles, make ``name`` Hypothesis' current profile and return its settings.

    Raises ConfigError("profile", name, ...) for an unknown name.
    """
    register_profiles()
    settings.load_profile(_check_name(name))
    return settings.get_profile(name)


def default_profile_name(env: Mapping[str, str] | None = None) -> str:
    """``HYPOTHESIS_PROFILE`` if set, else ``"ci"`` when ``CI`` is true-ish, else ``"dev"``.

    Raises ConfigError when ``HYPOTHESIS_PROFILE`` names an unknown profile.
    """
    env = os.environ if env is None else env
    chosen = env.get("HYPOTHESIS_PROFILE")
    if chosen:
        return _check_name(chosen)
    if env.get("CI", "").strip().lower() in ("1", "true", "yes"):
        return "ci"
    return DEFAULT_PROFILE
