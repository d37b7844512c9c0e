"""Settings profiles: selectable from pytest, from the library and from the CLI; the
examples reported are the examples Hypothesis ran; a failure says how to reproduce it."""

import pytest
from hypothesis import strategies as st

from distcheck.core.errors import ConfigError, PropertyFailure
from distcheck.engine.profiles import PROFILES, default_profile_name, get_profile, hypothesis_name
from distcheck.props import Property, run_property

pytest_plugins = ("pytester",)


def _prop(strategy, fn=lambda case: None, name="demo.prop"):
    return Property(name, lambda: strategy, fn, "demo")


def test_examples_are_counted_not_configured():
    # three possible cases: Hypothesis stops after 3 although ci allows 40
    result = run_property(_prop(st.sampled_from([1, 2, 3])), "ci")
    assert result.verdict == "pass" and result.examples == 3
    assert result.extra["max_examples"] == 40
    wide = _prop(st.integers(0, 10**6))
    assert run_property(wide, "ci").examples == 40
    assert run_property(wide, "dev").examples == 25  # the profile takes effect


def test_failure_reports_counts_blob_and_replay():
    def fails_above_ten(case):
        if case > 10:
            raise PropertyFailure("too big", expected="<= 10", got=case)

    result = run_property(_prop(st.integers(0, 1000), fails_above_ten), "dev", seed=1234)
    assert result.verdict == "FAIL"
    assert result.extra["counterexample"] == "11"  # shrunk to the boundary
    assert result.examples == result.extra["examples_until_failure"] + result.extra["shrink_calls"]
    assert result.extra["shrink_calls"] > 0
    assert result.extra["reproduce_failure"].startswith("@reproduce_failure(")
    assert result.extra["reproduce"] == "run_property('demo.prop', profile='dev', seed=1234)"
    again = run_property(_prop(st.integers(0, 1000), fails_above_ten), "dev", seed=1234)
    assert again.extra["counterexample"] == "11" and again.examples == result.examples  # the seed replays it


def test_profiles_and_defaults():
    assert get_profile("ci").derandomize and get_profile("ci").database is None
    assert [get_profile(n).max_examples for n in ("dev", "ci", "thorough")] == [25, 40, 400]
    assert hypothesis_name("ci") == "distcheck-ci"  # Hypothesis' own "ci" profile is left alone
    assert all(get_profile(n).print_blob for n in PROFILES)
    assert default_profile_name({}) == "dev"
    assert default_profile_name({"CI": "true"}) == "ci"
    assert default_profile_name({"CI": "true", "HYPOTHESIS_PROFILE": "thorough"}) == "thorough"
    with pytest.raises(ConfigError, match="profile"):
        default_profile_name({"HYPOTHESIS_PROFILE": "nightly"})
    with pytest.raises(ConfigError):
        run_property(_prop(st.just(1)), "fast")


def test_profiles_do_not_inherit_hypothesis_ci_profile():
    # under CI=true Hypothesis makes its own "ci" profile current (derandomized); dev and
    # thorough must still draw at random, in a fresh process whatever this one's env is
    import os
    import subprocess
    import sys

    code = ("from distcheck.engine.profiles import get_profile as g; "
            "print([(n, g(n).derandomize, g(n).database is None) for n in ('dev', 'ci', 'thorough')])")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CI": "true"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[('dev', False, False), ('ci', True, True), ('thorough', False, False)]"


def test_cli_passes_its_profile_to_run_all(monkeypatch, capsys):
    import distcheck.props as props
    from distcheck.cli import main
    from distcheck.report import CheckResult

    seen = []

    def fake_run_all(profile="ci", **kwargs):
        seen.append(profile)
        return [CheckResult("demo", "reference", "pass", examples=get_profile(profile).max_examples)]

    monkeypatch.setattr(props, "run_all", fake_run_all)
    assert main(["check", "--only", "properties", "--profile", "dev", "--format", "json"]) == 0
    assert main(["check", "--only", "properties", "--format", "json"]) == 0
    assert seen == ["dev", "ci"]
    assert '"examples": 25' in capsys.readouterr().out


_FAILING_TEST = """
from hypothesis import given
from distcheck import strategies as ds

@given(ds.shard_sizes(equal=False))
def test_all_shards_equal(sizes):
    assert len(set(sizes)) == 1
"""


@pytest.fixture
def keep_current_profile():
    from hypothesis import settings

    name = settings.get_current_profile_name()
    yield
    settings.load_profile(name)  # the in-process run below loads its own


def test_pytest_option_selects_the_profile_and_failures_print_the_blob(pytester, keep_current_profile):
    # the plugin comes from distcheck's pytest11 entry point: no -p needed
    pytester.makepyfile(test_user=_FAILING_TEST)
    result = pytester.runpytest_inprocess("--distcheck-profile=ci")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "distcheck profile: ci" in text
    assert "@reproduce_failure(" in text  # what reproduces the failure
    assert "sizes=(1, 2)" in text or "(1, 2)" in text  # the shrunk counterexample
