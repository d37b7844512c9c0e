"""Discovery, not lists: the engine finds the parallelism packages and their role modules by
walking distcheck.parallel, so a new package adds its forms, strategies, properties, mutants,
proofs and contracts without an edit anywhere else.

The demonstration package is written to a temporary folder and put on ``distcheck.parallel``'s
search path in a fresh interpreter, so the registries of this process stay as they are.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from distcheck.engine import discovery

ROOT = Path(__file__).resolve().parent.parent

PACKAGES = {"activations", "comm", "dp", "layout", "memory", "params", "pp", "tp", "zero"}


def test_the_packages_are_found_by_walking_the_parallel_package():
    assert set(discovery.packages()) >= PACKAGES
    assert list(discovery.packages()) == sorted(discovery.packages())
    on_disk = {p.name for p in (ROOT / "distcheck" / "parallel").iterdir() if (p / "__init__.py").is_file()}
    assert set(discovery.packages()) == on_disk


def _on_disk(role: str) -> set[str]:
    """The role modules of every package, read off the folders: ``<role>.py`` and ``<topic>_<role>.py``."""
    return {f"distcheck.parallel.{f.parent.name}.{f.stem}"
            for f in (ROOT / "distcheck" / "parallel").glob("*/*.py") if f.stem == role or f.stem.endswith("_" + role)}


def test_role_modules_are_imported_where_they_exist():
    forms = {m.__name__ for m in discovery.role_modules("forms")}
    assert forms == _on_disk("forms")
    assert {f"distcheck.parallel.{p}.forms" for p in PACKAGES} | {"distcheck.parallel.tp.vocab_forms"} <= forms
    assert discovery.role_module("memory", "properties") is None  # memory has forms, no properties
    mutants = {m.__name__ for m in discovery.role_modules("mutants")}
    assert mutants == _on_disk("mutants")
    assert {m.split(".")[2] for m in mutants} >= {"dp", "layout", "params", "pp", "tp", "zero"}
    from distcheck.core.errors import ConfigError

    with pytest.raises(ConfigError, match="role='tests' must be one of"):
        discovery.role_modules("tests")


def test_every_package_says_what_it_covers_and_its_sources():
    import importlib

    for name in discovery.packages():
        package = importlib.import_module(f"distcheck.parallel.{name}")
        doc = package.__doc__ or ""
        assert "Source" in doc and "Public API" in doc and package.__all__, name  # its face: tests/test_surface.py


def test_a_mutant_is_served_and_pickled_under_its_public_path():
    from distcheck.mutants import MUTANTS, plain_mean_unequal

    assert MUTANTS["dp.plain_mean_unequal"].function is plain_mean_unequal
    assert plain_mean_unequal.__module__ == "distcheck.mutants"
    assert pickle.loads(pickle.dumps(plain_mean_unequal)) is plain_mean_unequal
    with pytest.raises(ImportError):
        from distcheck.mutants import no_such_mutant  # noqa: F401


_DEMO = {
    "__init__.py": '''"""A demonstration package. Sources: none. Public path: distcheck.parallel.zz_demo."""''',
    "reference.py": """
        def double(n):
            return 2 * n
        """,
    "forms.py": """
        from distcheck.core.closed_form import ClosedForm, Input, register

        _N = Input("n", "a count", "count")
        DOUBLE = register(ClosedForm("zz_demo.double", 2 * _N.symbol, (_N,), "count", "arithmetic", "twice n"))
        """,
    "strategies.py": """
        from hypothesis import strategies as st

        from distcheck.core.validate import check_interval
        from distcheck.engine.strategies import defines

        __all__ = ["counts"]


        def _v(*, max_n):
            check_interval("min_n", 1, "max_n", max_n)


        @defines(_v)
        def counts(draw, *, max_n: int = 9):
            return draw(st.integers(1, max_n))
        """,
    "properties.py": """
        from distcheck.core.errors import PropertyFailure
        from distcheck.engine.catalogue import form_value
        from distcheck.engine.registry import Property, register
        from distcheck.engine.runner import call_impl
        from distcheck.parallel.zz_demo.reference import double
        from distcheck.parallel.zz_demo.strategies import counts


        def doubles(n, *, impl=double):
            got = call_impl("double", impl, n)
            if got != form_value("zz_demo.double", n=n):
                raise PropertyFailure(f"double({n})", expected=2 * n, got=got)


        register(Property("zz_demo.double.exact", counts, doubles, "double == 2 n", double, "double(n)",
                          lambda: (3,)))
        """,
    "mutants.py": """
        from distcheck.engine.mutants import mutant


        @mutant("zz_demo.off_by_one", "zz_demo.double.exact")
        def double_plus_one(n):
            \"\"\"Twice n plus one.\"\"\"
            return 2 * n + 1
        """,
    "proofs.py": """
        from distcheck.engine.catalogue import get
        from distcheck.engine.proofs import proof, zero


        @proof("proof.zz_demo.double")
        def double_is_n_plus_n():
            f = get("zz_demo.double")
            n = f.symbols["n"]
            return zero(f.expr - (n + n)), "2 n = n + n"
        """,
    "contracts.py": """
        from hypothesis import strategies as st

        from distcheck.engine.contracts.contract import Contract, Outcome, PropertySpec
        from distcheck.engine.contracts.targets import make_target, resolve


        class Doubles(Contract):
            name = "zz-demo-double"
            min_world_size = 1
            min_world_reason = "runs in this process, whatever the world"
            parallelism = "zz_demo"
            summary = "f(n) = 2 n"
            properties = (PropertySpec("value", "f(n) == 2 n", "exact"),)
            dtypes = ("float64",)
            needs_world = False

            def resolve(self, obj, ref, options):
                return make_target(obj, ref, "function"), options

            def cases(self, world_size, dtype, options):
                return st.integers(1, 9)

            def run_rank(self, ctx, target, case, dtype, options):
                return resolve(target)(case)

            def check(self, case, results, world_size, dtype, options):
                got = results[0]
                return {"value": Outcome(got == 2 * case, message=f"f({case}) = {got}, expected {2 * case}")}
        """,
    "findings.py": """
        from distcheck.engine.findings import Finding

        FINDINGS = (Finding(name="demo.double_is_odd", check="zz_demo.double.exact", symptom=r"double\\(1\\) = 3",
                            summary="doubles oddly", library="numpy", seen_on=("1.0",), reproduce="python -c 0",
                            reported="nowhere"),)
        """,
}

_RUN = """
import sys
import distcheck.parallel
distcheck.parallel.__path__.append(sys.argv[1])
from distcheck.closed_form import get
from distcheck.engine.discovery import packages
from distcheck.engine.proofs import prove
from distcheck.mutants import kill_mutant
from distcheck.props import properties, run_property
from distcheck import strategies as ds
print("package", "zz_demo" in packages())
print("form", get("zz_demo.double").evaluate(n=21))
print("property", [p.name for p in properties("zz_demo")], run_property("zz_demo.double.exact").verdict)
print("strategy", "counts" in ds.__all__, ds.counts.__module__)
print("mutant", kill_mutant("zz_demo.off_by_one").extra["outcome"])
print("proof", prove("proof.zz_demo.double").verdict)
from distcheck.engine.findings import known_findings, label_findings
from distcheck.report import CheckResult
print("findings", [f.name for f in known_findings() if f.name.startswith("demo.")],
      [r.verdict for r in label_findings(
          [CheckResult("zz_demo.double.exact", "gloo", "FAIL", 2, 1, detail="double(1) = 3"),
           CheckResult("zz_demo.double.exact", "gloo", "FAIL", 2, 1, detail="double(2) = 5")],
          versions={"numpy": "1.0"})])
from distcheck.certify import certify, contracts
print("contracts", [c.name for c in contracts() if c.name.startswith("zz-")], callable(distcheck.certify.contracts))
print("certify", certify("distcheck.parallel.zz_demo.reference:double", "zz-demo-double").ok,
      certify("distcheck.parallel.zz_demo.mutants:double_plus_one", "zz-demo-double").ok)
"""


def _demo(tmp_path: Path, **changes: str) -> Path:
    pkg = tmp_path / "zz_demo"
    pkg.mkdir()
    for name, text in {**_DEMO, **changes}.items():
        (pkg / name).write_text(textwrap.dedent(text))
    return tmp_path


def _run(folder: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", _RUN, str(folder)], capture_output=True, text=True, timeout=240,
                          env=env, cwd=str(folder))


def test_a_new_package_is_picked_up_whole_with_no_other_edit(tmp_path):
    proc = _run(_demo(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        "package True",
        "form 42",
        "property ['zz_demo.double.exact'] pass",
        "strategy True distcheck.strategies",
        "mutant killed",
        "proof pass",
        "findings ['demo.double_is_odd'] ['finding', 'FAIL']",  # only the exact symptom is the finding
        "contracts ['zz-demo-double'] True",  # found in the package's role module
        "certify True False",  # the reference is certified, the mutant is not
    ]


def test_a_strategies_module_whose_all_is_wrong_fails_loudly_at_import(tmp_path):
    wrong = _DEMO["strategies.py"].replace('__all__ = ["counts"]', '__all__ = ["counts", "sizes"]')
    proc = _run(_demo(tmp_path, **{"strategies.py": wrong}))
    assert proc.returncode != 0
    message = "zz_demo.strategies.__all__ does not list what the module defines: missing [], extra ['sizes']"
    assert message in proc.stderr


def test_loading_the_properties_needs_no_optional_dependency():
    """An installed wheel has no pytest, matplotlib or third-party targets: the properties stage
    must load all it needs without them (a wheel's `distcheck check` once died importing pytest)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "for name in ('pytest', 'matplotlib', 'torch', 'deepspeed', 'accelerate', 'megatron', 'torchtitan'):\n"
            "    sys.modules[name] = None  # importing any of them raises ImportError\n"
            "from distcheck.engine.discovery import import_package\n"
            "from distcheck.engine.registry import properties\n"
            "import_package()\n"
            "print(len(properties()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 28


def test_companion_modules_carry_a_role_next_to_its_module():
    """``<topic>_<role>`` modules are found after the role module (a topic in a file of its own)."""
    assert discovery.companion_modules("tp", "contracts") == ("distcheck.parallel.tp.vocab_contracts",
                                                              "distcheck.parallel.tp.vocab_head_contracts")
    assert discovery.companion_modules("tp", "forms") == ("distcheck.parallel.tp.vocab_forms",)
    assert discovery.companion_modules("tp", "reference") == ()  # tp/vocab.py is imported by name, not a companion
    names = [m.__name__ for m in discovery.role_modules("contracts")]
    assert names.index("distcheck.parallel.tp.vocab_contracts") == names.index("distcheck.parallel.tp.contracts") + 1
    from distcheck.engine.contracts.contract import get_contract

    assert get_contract("vocab-parallel-embedding").parallelism == "tp"
