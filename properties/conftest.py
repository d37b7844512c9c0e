"""pytest configuration of the property suites: the Hypothesis settings profile.

Select with ``--distcheck-profile=dev|ci|thorough`` or the ``HYPOTHESIS_PROFILE``
environment variable; default ``ci`` when ``CI=true``, else ``dev``
(:func:`distcheck.profiles.default_profile_name`).
"""

from __future__ import annotations

import pytest

from distcheck.profiles import PROFILES, default_profile_name, load_profile


def pytest_addoption(parser):
    group = parser.getgroup("distcheck")
    group.addoption(
        "--distcheck-profile",
        action="store",
        default=None,
        choices=sorted(PROFILES),
        help="Hypothesis settings profile for distcheck's properties (default: HYPOTHESIS_PROFILE, "
        "else 'ci' when CI=true, else 'dev')",
    )


def _profile_name(config) -> str:
    return config.getoption("--distcheck-profile", default=None) or default_profile_name()


def pytest_configure(config):
    load_profile(_profile_name(config))


def pytest_report_header(config):
    return f"distcheck profile: {_profile_name(config)}"


@pytest.fixture(scope="session")
def distcheck_profile(pytestconfig) -> str:
    """The selected profile name, for tests that call distcheck.props.run_property."""
    return _profile_name(pytestconfig)
