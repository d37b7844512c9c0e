"""distcheck's pytest plugin: installed through its ``pytest11`` entry point, it adds the
``--distcheck-profile`` option and changes no Hypothesis setting of a suite that does not
give it. Each suite below runs in a fresh pytest process (``runpytest_subprocess``), which
loads the plugin from the installed entry point as any user's suite would."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys

import pytest

pytest_plugins = ["pytester"]

_SETTINGS_TEST = """
from hypothesis import settings

def test_settings(request):
    import distcheck.pytest_plugin
    assert request.config.pluginmanager.get_plugin("distcheck") is distcheck.pytest_plugin  # loaded
    s = settings()
    print("SETTINGS", settings.get_current_profile_name(), s.max_examples, s.derandomize, s.database is None)
"""


@pytest.fixture
def no_ci(monkeypatch):
    """An environment in which Hypothesis does not see a CI machine."""
    ci_vars = getattr(importlib.import_module("hypothesis._settings"), "_CI_VARS", {"CI": None})
    for name in ci_vars:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)


def _settings_line(result) -> list[str]:
    result.assert_outcomes(passed=1)
    (line,) = [ln for ln in result.outlines if "SETTINGS " in ln]
    return line.split("SETTINGS ", 1)[1].split()


def test_entry_point_names_the_plugin():
    found = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "distcheck"]
    assert [e.value for e in found] == ["distcheck.pytest_plugin"], \
        "install distcheck (pip install -e .) so that its pytest11 entry point exists"


def test_importing_the_plugin_imports_nothing_heavy():
    code = ("import sys, distcheck.pytest_plugin; "
            "print(sorted(m for m in ('hypothesis', 'torch', 'sympy', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_plain_suite_keeps_hypothesis_default_settings(pytester, no_ci, monkeypatch):
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "thorough")  # means nothing to the plugin
    pytester.makepyfile(test_plain=_SETTINGS_TEST)
    result = pytester.runpytest_subprocess("-s")
    assert _settings_line(result) == ["default", "100", "False", "False"]
    assert "distcheck profile" not in result.stdout.str()


def test_plain_suite_on_a_ci_machine_keeps_hypothesis_own_ci_profile(pytester, no_ci, monkeypatch):
    # Hypothesis makes its "ci" profile current under CI=true; using distcheck's profiles in the
    # suite (run_property registers them) must not replace it with distcheck's ci (40 examples)
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(test_plain=_SETTINGS_TEST.replace(
        "    s = settings()", "    from distcheck.engine.profiles import get_profile\n"
                              "    assert get_profile('ci').max_examples == 40\n    s = settings()"))
    result = pytester.runpytest_subprocess("-s")
    assert _settings_line(result) == ["ci", "100", "True", "True"]


@pytest.mark.parametrize("name, expected", [("ci", ["distcheck-ci", "40", "True", "True"]),
                                            ("thorough", ["distcheck-thorough", "400", "False", "False"])])
def test_distcheck_profile_option_loads_that_profile(pytester, no_ci, name, expected):
    pytester.makepyfile(test_plain=_SETTINGS_TEST)
    result = pytester.runpytest_subprocess("-s", f"--distcheck-profile={name}")
    assert _settings_line(result) == expected
    result.stdout.fnmatch_lines([f"distcheck profile: {name}"])  # in the report header


def test_help_shows_the_option_group(pytester, no_ci):
    result = pytester.runpytest_subprocess("--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["distcheck (settings profiles, certifying layers on rank pools):",
                                 "*--distcheck-profile={dev,ci,thorough}*"])


def test_two_profile_options_are_a_usage_error(pytester, no_ci):
    pytester.makepyfile(test_plain=_SETTINGS_TEST)
    result = pytester.runpytest_subprocess("--distcheck-profile=ci", "--hypothesis-profile=ci")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--distcheck-profile and --hypothesis-profile both name a settings profile*"])


def test_the_plugin_can_be_turned_off(pytester, no_ci):
    pytester.makepyfile(test_plain=_SETTINGS_TEST)
    result = pytester.runpytest_subprocess("-p", "no:distcheck", "--distcheck-profile=ci")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unrecognized arguments: --distcheck-profile=ci*"])


def test_without_autoload_the_entry_point_name_loads_it(pytester, no_ci, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_plain=_SETTINGS_TEST)
    result = pytester.runpytest_subprocess("-s", "-p", "distcheck", "--distcheck-profile=ci")
    assert _settings_line(result) == ["distcheck-ci", "40", "True", "True"]
