"""What keeps the README's test command affordable on 2 cores, without dropping a test from CI.

The ``nodes`` tests (several torchrun agents as the nodes of one world) are deselected by pyproject.toml's
``addopts`` and run by a step of .ci/run of their own; the package is built once per session (conftest.py's
``built_dist``), not once per module that needs the wheel.
"""

from __future__ import annotations

import ast
import re
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pytest_ini() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def _marks(func: ast.FunctionDef) -> set[str]:
    """The ``pytest.mark.NAME`` decorators of one test function."""
    found = set()
    for deco in func.decorator_list:
        node = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "pytest.mark":
            found.add(node.attr)
    return found


def test_nodes_tests_are_left_out_by_default_and_ci_runs_them():
    ini = _pytest_ini()
    args = shlex.split(ini["addopts"])
    assert args[args.index("-m") + 1] == "not nodes and not slow", ini["addopts"]
    assert any(m.startswith("nodes:") for m in ini["markers"]), ini["markers"]
    tree = ast.parse((ROOT / "tests" / "test_torchrun_nodes.py").read_text())
    tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    assert tests and all("nodes" in _marks(t) for t in tests), [(t.name, _marks(t)) for t in tests]
    ci = (ROOT / ".ci" / "run").read_text()
    runs = [ln for ln in ci.splitlines() if not ln.lstrip().startswith("#") and "-m pytest" in ln]
    assert any(re.search(r"\s-m nodes(\s|$)", ln) for ln in runs), runs  # its -m replaces addopts' one
    assert any('-m "slow and not nodes"' in ln for ln in runs), runs  # and so does the slow tests' step
    assert "-m nodes" in (ROOT / "docs" / "TESTING.md").read_text()


def test_the_package_is_built_once_per_session():
    builders = [p.name for p in sorted((ROOT / "tests").rglob("*.py"))
                if re.search(r'"-m",\s*"build"', p.read_text())]
    assert builders == ["conftest.py"], builders
    source = (ROOT / "tests" / "conftest.py").read_text()
    assert '@pytest.fixture(scope="session")\ndef built_dist(' in source
    for name in ("test_packaging.py", "test_acceptance.py"):
        assert "built_dist" in (ROOT / "tests" / name).read_text(), name
