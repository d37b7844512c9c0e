"""pytest configuration of the property suites: the Hypothesis settings profile.

Select with ``--distcheck-profile=dev|ci|thorough`` or the ``HYPOTHESIS_PROFILE``
environment variable; default ``ci`` when ``CI=true``, else ``dev``
(:func:`distcheck.profiles.default_profile_name`). The hooks live in
:mod:`distcheck.pytest_plugin`; they are registered here unless the plugin is
already loaded (``-p distcheck.pytest_plugin`` or its ``pytest11`` entry point).
"""

from __future__ import annotations

import pytest

from distcheck import pytest_plugin
from distcheck.profiles import PROFILES


def pytest_addoption(parser, pluginmanager):
    if not pluginmanager.has_plugin("distcheck") and not pluginmanager.has_plugin("distcheck.pytest_plugin"):
        pytest_plugin.pytest_addoption(parser)


def _plugin_active(config) -> bool:
    pm = config.pluginmanager
    return pm.has_plugin("distcheck") or pm.has_plugin("distcheck.pytest_plugin")


def pytest_configure(config):
    if not _plugin_active(config):
        pytest_plugin.pytest_configure(config)


def pytest_report_header(config):
    if not _plugin_active(config):
        return pytest_plugin.pytest_report_header(config)
    return None


@pytest.fixture(scope="session")
def distcheck_profile(pytestconfig) -> str:
    """The selected profile name, for tests that call distcheck.props.run_property.

    With ``--hypothesis-profile=NAME`` (and no distcheck selection) it is NAME when
    NAME is one of distcheck's profiles, else ``ci``.
    """
    name = pytest_plugin.selected_profile(pytestconfig)
    if name is None:
        from hypothesis import settings

        current = settings.get_current_profile_name()
        name = current if current in PROFILES else "ci"
    return name
