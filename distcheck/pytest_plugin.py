"""pytest plugin: select distcheck's Hypothesis settings profile (dev, ci, thorough).

Adds ``--distcheck-profile=dev|ci|thorough``. Without it the profile is
``HYPOTHESIS_PROFILE`` when set, else ``ci`` when ``CI`` is true, else ``dev``
(:func:`distcheck.profiles.default_profile_name`); an explicit
``--hypothesis-profile`` (Hypothesis' own option) is respected when neither
``--distcheck-profile`` nor ``HYPOTHESIS_PROFILE`` is given. The chosen profile is
loaded in ``pytest_configure`` and shown in the report header
(``distcheck profile: ci``).

The profiles are registered when this module is imported, so Hypothesis' own
``--hypothesis-profile=thorough`` finds them too. Every profile prints the
``@reproduce_failure(...)`` blob of a failing example (``print_blob=True``).

Loaded by ``properties/conftest.py``; installed packages can load it with
``-p distcheck.pytest_plugin`` or the ``pytest11`` entry point ``distcheck``.
Imports only Hypothesis and :mod:`distcheck.profiles`.

Certifying layers in a suite (:mod:`distcheck.certify.pytest_support`): the
``--distcheck-world-sizes/-backend/-examples/-seed/-timeout`` options, the
``world_size`` marker and the session-scoped ``rank_pool``, ``world_size`` and
``distcheck_certify`` fixtures; torch is imported when a fixture starts a pool.
"""

from __future__ import annotations

import os

from distcheck.certify import pytest_support as _certify  # stdlib and pytest only: no torch at load
from distcheck.certify.pytest_support import (  # noqa: F401 - fixtures, registered with this plugin
    distcheck_certify,
    distcheck_pools,
    distcheck_world,
    rank_pool,
    world_size,
)
from distcheck.profiles import PROFILES, default_profile_name, load_profile, register_profiles

__all__ = ["OPTION", "pytest_addoption", "pytest_configure", "pytest_report_header", "pytest_generate_tests",
           "selected_profile"]

OPTION = "--distcheck-profile"

register_profiles()


def pytest_addoption(parser) -> None:
    group = parser.getgroup("distcheck")
    group.addoption(
        OPTION,
        action="store",
        default=None,
        choices=sorted(PROFILES),
        help="Hypothesis settings profile for distcheck's properties (default: HYPOTHESIS_PROFILE, "
        "else 'ci' when CI=true, else 'dev')",
    )
    _certify.add_options(group)


def selected_profile(config) -> str | None:
    """The distcheck profile to load, or None when the user chose one with ``--hypothesis-profile``.

    Raises ConfigError when ``HYPOTHESIS_PROFILE`` names an unknown profile.
    """
    chosen = config.getoption(OPTION, default=None)
    if chosen:
        return chosen
    if not os.environ.get("HYPOTHESIS_PROFILE") and config.getoption("hypothesis_profile", default=None):
        return None
    return default_profile_name()


def pytest_configure(config) -> None:
    name = selected_profile(config)
    if name is not None:
        load_profile(name)
    _certify.configure(config)


def pytest_generate_tests(metafunc) -> None:
    _certify.generate_tests(metafunc)


def pytest_report_header(config) -> str:
    name = selected_profile(config)
    return f"distcheck profile: {name}" if name else "distcheck profile: (--hypothesis-profile)"
