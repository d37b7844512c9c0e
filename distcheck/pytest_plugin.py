"""pytest plugin: run a suite under one of distcheck's Hypothesis settings profiles, on request.

Installing distcheck registers this plugin with pytest (the ``pytest11`` entry point
``distcheck``). It adds one option group, ``distcheck``, with the profile option::

    --distcheck-profile {dev,ci,thorough}

and does nothing else:

- Without the option no Hypothesis setting changes. A suite that does not ask keeps
  what Hypothesis chose: its ``default`` profile, or on a CI machine (``CI=true``) its
  own ``ci`` profile, which distcheck never replaces (:mod:`distcheck.engine.profiles`).
  ``HYPOTHESIS_PROFILE`` means nothing to the plugin (Hypothesis does not read it
  either); this repository's ``properties/conftest.py`` reads it for its own suite.
- With the option the profile is registered and loaded in ``pytest_configure``, before
  Hypothesis' own plugin applies ``--hypothesis-verbosity`` or ``--hypothesis-seed`` on
  top, and the report header says ``distcheck profile: NAME``. Giving Hypothesis'
  ``--hypothesis-profile`` as well is a usage error: it would load a second profile.

Importing this module imports neither Hypothesis nor torch nor sympy: pytest imports
every installed plugin when it starts.

Turn it off with ``-p no:distcheck``; under ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` turn it
on with ``-p distcheck``. From a checkout that is not installed (``PYTHONPATH=.``), load
the module with ``-p distcheck.pytest_plugin``; once distcheck is installed that second
name registers the module twice, and pytest refuses it.

Certifying layers in a suite (:mod:`distcheck.certify.pytest_support`): the
``--distcheck-world-sizes/-backend/-examples/-seed/-timeout`` options, the
``world_size`` marker and the session-scoped ``rank_pool``, ``world_size`` and
``distcheck_certify`` fixtures; torch is imported when a fixture starts a pool. A test whose
certification can fail nothing (``assert_certified()`` raising
:class:`~distcheck.engine.contracts.errors.NothingCanFail`: a world below the contract's
smallest, ``@pytest.mark.world_size(1)`` on a tensor-parallel contract) is a skip with the
reason, never a pass.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from distcheck.certify import pytest_support as _certify  # stdlib and pytest only: no torch at load
from distcheck.certify.pytest_support import (  # noqa: F401 - fixtures, registered with this plugin
    distcheck_certify,
    distcheck_pools,
    distcheck_world,
    rank_pool,
    world_size,
)
from distcheck.engine.profiles import PROFILES

__all__ = ["OPTION", "pytest_addoption", "pytest_configure", "pytest_report_header", "pytest_generate_tests",
           "pytest_runtest_call", "requested_profile"]

OPTION = "--distcheck-profile"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distcheck", "distcheck (settings profiles, certifying layers on rank pools)")
    group.addoption(
        OPTION,
        dest="distcheck_profile",
        action="store",
        default=None,
        choices=list(PROFILES),
        help="load this distcheck Hypothesis settings profile: dev (25 examples), ci (40, derandomized, no "
             "database) or thorough (400). Default: none, Hypothesis' own settings are left alone.",
    )
    _certify.add_options(group)


def requested_profile(config: pytest.Config) -> str | None:
    """The profile named by ``--distcheck-profile``, or None when the option was not given."""
    return config.getoption("distcheck_profile", default=None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    _certify.configure(config)
    name = requested_profile(config)
    if name is None:
        return
    if config.getoption("hypothesis_profile", default=None):
        raise pytest.UsageError(f"{OPTION} and --hypothesis-profile both name a settings profile; give one")
    from distcheck.engine.profiles import load_profile

    load_profile(name)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    _certify.generate_tests(metafunc)


def pytest_report_header(config: pytest.Config) -> str | None:
    name = requested_profile(config)
    return f"distcheck profile: {name}" if name else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """A test whose certification could fail nothing is skipped with the reason, not passed or failed."""
    from distcheck.engine.contracts.errors import NothingCanFail

    try:
        return (yield)
    except NothingCanFail as exc:
        pytest.skip(str(exc))
