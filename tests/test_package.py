"""Package-level contracts: the core imports without torch, errors carry field/value/rule,
and the README's two commands are the ones CI runs."""

import subprocess
import sys
from pathlib import Path

import pytest

from distcheck.core.errors import ConfigError
from distcheck.core.units import GB, GiB, bytes_to, to_bytes
from distcheck.core.validate import check_choice, check_divides, check_positive_int

ROOT = Path(__file__).resolve().parent.parent
CORE = [
    "distcheck", "distcheck.closed_form", "distcheck.strategies", "distcheck.parallel.dp", "distcheck.parallel.tp",
    "distcheck.parallel.sp", "distcheck.parallel.pp", "distcheck.parallel.memory", "distcheck.parallel.zero",
    "distcheck.parallel.activations", "distcheck.parallel.params", "distcheck.parallel.layout",
    "distcheck.parallel.comm",
]


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_without_torch(module):
    # every public name of the module loaded (a package's face serves its names on first access)
    code = f"import sys, {module} as m; [getattr(m, n) for n in getattr(m, '__all__', ())]; " \
           f"from distcheck.closed_form import catalogue; catalogue(); sys.exit(1 if 'torch' in sys.modules else 0)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr or f"{module} imported torch"


def test_config_error_names_field_value_and_rule():
    err = ConfigError("tp", 3, "must divide num_kv_heads=8")
    assert str(err) == "tp=3 must divide num_kv_heads=8"
    assert (err.field, err.value, err.rule) == ("tp", 3, "must divide num_kv_heads=8")
    assert isinstance(err, ValueError)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: check_positive_int("m", 0), "m=0 must be >= 1"),
        (lambda: check_positive_int("m", 2.0), "m=2.0 must be an integer"),
        (lambda: check_positive_int("m", True), "m=True must be an integer"),
        (lambda: check_divides("tp", 3, "num_kv_heads", 8), "tp=3 must divide num_kv_heads=8"),
        (lambda: check_choice("schedule", "zb", ("gpipe", "1f1b")), "schedule='zb' must be one of 'gpipe', '1f1b'"),
    ],
)
def test_validation_helpers_raise_config_error(call, message):
    with pytest.raises(ConfigError) as info:
        call()
    assert str(info.value) == message


def test_units_are_exact_and_distinguish_gb_from_gib():
    assert GB == 10**9 and GiB == 2**30
    assert bytes_to(107_810_390_016, "GB") * 100 // 1 == 10781  # 107.81 GB
    assert bytes_to(2**31, "GiB") == 2
    assert to_bytes("1.5", "GB") == 1_500_000_000
    with pytest.raises(ConfigError, match="unit='gb' must be one of"):
        bytes_to(1, "gb")


def _in_order(ci: str, steps: list[str]) -> list[int]:
    """Where each step stands in ``ci``, each found after the one before (an earlier step may make a venv of its
    own); fails naming the first step not found in that order."""
    positions, at = [], 0
    for step in steps:
        at = ci.find(step, at)
        assert at != -1, f"{step!r} not found after {steps[len(positions) - 1]!r}" if positions else step
        positions.append(at)
    return positions


def test_ci_runs_the_readme_test_command_then_checks_the_wheel_outside_the_checkout():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "readme_commands.py test" in ci
    subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")], check=True)  # it parses
    steps = ["-m build", "-m venv", '"$torch_pin"', 'cd "$work"', "check --only golden --only properties",
             "audit zero_paper"]
    positions = _in_order(ci, steps)
    assert ci.find("readme_commands.py test") < positions[0]
    out = subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_commands.py"), "test"],
                         capture_output=True, text=True, check=True).stdout
    assert "pytest" in out and "requirements-ci.txt" in out
    main = subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_commands.py"), "main"],
                          capture_output=True, text=True, check=True).stdout
    assert main.strip().endswith("distcheck check")


@pytest.mark.parametrize(
    "value, message",
    [
        (True, "m=True must be a number (positive integer), not bool"),
        ("4", "m='4' must be a number (positive integer), not str"),
        (1.5, "m=1.5 must be an integer >= 1"),
        (float("nan"), "m=nan must be a finite number"),
        (0, "m=0 must be an integer >= 1"),
    ],
)
def test_closed_form_inputs_reject_bools_strings_and_out_of_domain_values(value, message):
    from distcheck.closed_form import get

    with pytest.raises(ConfigError) as info:
        get("pp.bubble_fraction.gpipe").evaluate(p=4, m=value)
    assert str(info.value) == message


def test_closed_form_takes_integral_floats_at_their_exact_value():
    from fractions import Fraction

    from distcheck.closed_form import get

    assert get("zero.bytes_per_gpu.stage3").evaluate(params=7.5e9, dp=64) == 1_875_000_000
    assert get("pp.bubble_fraction.gpipe").evaluate(p=4, m=Fraction(16)) == Fraction(3, 19)


def test_config_error_shows_fractions_as_a_user_writes_them():
    from fractions import Fraction

    assert str(ConfigError("dp", Fraction(17, 2), "must be an integer")) == "dp=17/2 must be an integer"
    assert str(ConfigError("dp", Fraction(8), "must be even")) == "dp=8 must be even"


def test_ci_runs_an_exploratory_dev_run_seeded_by_the_commit_after_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    steps = ["readme_commands.py test", 'bash -c "$cmd"', "seed=$(.venv/bin/python .ci/commit_seed.py)",
             'echo "exploratory run: seed $seed (profile dev)',
             '-m distcheck check --profile dev --seed "$seed" --only properties',
             '-m pytest -q -p no:cacheprovider --distcheck-profile dev --hypothesis-seed "$seed"', "-m build"]
    _in_order(ci, steps)
    # the script prints the seed of the checkout's commit, or of a revision given to it
    script = [sys.executable, str(ROOT / ".ci" / "commit_seed.py")]
    given = subprocess.run([*script, "1f3f4774fb8722d3ec6c98e7e9fee82c21abcd88"], capture_output=True, text=True,
                           check=True).stdout
    assert given == "524240756\n"  # int("1f3f4774", 16)
    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if git.returncode == 0:  # a checkout (CI's is one; an unpacked sdist is not)
        from distcheck.engine.profiles import commit_seed

        head = subprocess.run(script, capture_output=True, text=True, check=True).stdout
        assert head == f"{commit_seed(git.stdout)}\n"
    bad = subprocess.run([*script, "HEAD~1"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "commit_seed.py: revision='HEAD~1' must be a git object name: 8 to 64 lowercase hex digits "
        "(what `git rev-parse HEAD` prints)"]
