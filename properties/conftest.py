"""pytest configuration of this repository's property suites: which of distcheck's
Hypothesis settings profiles they run under.

``--distcheck-profile`` comes from distcheck's pytest plugin (:mod:`distcheck.pytest_plugin`),
which pytest loads through its ``pytest11`` entry point when distcheck is installed; from a
checkout that is not installed (``PYTHONPATH=.``) it is registered here. The plugin loads
a profile only when asked. This suite also chooses one when nobody asks, first match wins:

1. ``--distcheck-profile NAME``: the plugin loads it;
2. ``HYPOTHESIS_PROFILE=NAME``, one of distcheck's profiles;
3. Hypothesis' own ``--hypothesis-profile NAME``: Hypothesis loads it, nothing is loaded here;
4. ``ci`` when ``CI`` is true, else ``dev`` (:func:`distcheck.engine.profiles.default_profile_name`).

The seed: Hypothesis' own ``--hypothesis-seed N`` seeds the suite's ``@given`` tests, and the
``distcheck_seed`` fixture hands the same N to the tests that call
:func:`distcheck.props.run_property`, so ``--distcheck-profile dev --hypothesis-seed N`` replays a
whole run of the suite (CI's exploratory run, ``.ci/run``, takes N from the commit).
"""

from __future__ import annotations

import os

import pytest

from distcheck import pytest_plugin
from distcheck.engine.profiles import default_profile_name, load_profile


def pytest_addoption(parser, pluginmanager):
    # installed: the entry point registered it already; -p no:distcheck: leave it out
    if not pluginmanager.is_registered(pytest_plugin) and not pluginmanager.is_blocked("distcheck"):
        pluginmanager.register(pytest_plugin, "distcheck")


def suite_profile(config) -> str | None:
    """The distcheck profile this suite runs under, or None when ``--hypothesis-profile`` chose one.

    Raises ConfigError when ``HYPOTHESIS_PROFILE`` names an unknown profile.
    """
    requested = pytest_plugin.requested_profile(config)
    if requested:
        return requested
    if not os.environ.get("HYPOTHESIS_PROFILE") and config.getoption("hypothesis_profile", default=None):
        return None
    return default_profile_name()


def pytest_configure(config):
    if pytest_plugin.requested_profile(config) is None:  # else the plugin has loaded it
        name = suite_profile(config)
        if name is not None:
            load_profile(name)


def pytest_report_header(config):
    if pytest_plugin.requested_profile(config) is None:  # else the plugin's header names it
        name = suite_profile(config)
        return f"distcheck profile: {name} (default of properties/)" if name else None
    return None


@pytest.fixture(scope="session")
def distcheck_profile(pytestconfig) -> str:
    """The profile name for tests that call distcheck.props.run_property: the suite's profile,
    or ``ci`` when Hypothesis' ``--hypothesis-profile`` chose the settings."""
    return suite_profile(pytestconfig) or "ci"


@pytest.fixture(scope="session")
def distcheck_seed(pytestconfig) -> int | str | None:
    """The run seed for tests that call distcheck.props.run_property: Hypothesis' ``--hypothesis-seed``
    as an int (as Hypothesis reads it; a value that is not an integer stays a str, which run_property
    refuses with a ConfigError naming ``seed``), or None (the profile's own: 0 under ``ci``, drawn
    under ``dev``)."""
    seed = pytestconfig.getoption("hypothesis_seed", default=None)
    try:
        return None if seed is None else int(seed)
    except ValueError:
        return seed
