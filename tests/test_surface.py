"""The public surface: each parallelism's API is its package ``distcheck.parallel.<name>``.

- ``__all__`` of every package is exactly the public names of its internal modules' APIs (those it
  serves: the modules of ``sources``), less the names another package defines (checked as Hypothesis
  checks ``hypothesis.strategies.__all__``);
- every public name is documented and reachable by one public path (the packages' faces and the
  catalogues :mod:`distcheck.strategies` and :mod:`distcheck.mutants`);
- importing a package imports nothing else; the old paths are gone (tests/test_one_path.py).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from distcheck.core.face import faces

FACES = faces()


def _sources(package) -> tuple[str, ...]:
    """The internal modules a package serves its names from (the ``sources`` of its ``face`` call)."""
    tree = ast.parse(Path(package.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "face":
            kw = {k.arg: k.value for k in node.keywords}
            return tuple(ast.literal_eval(kw["sources"]))
    raise AssertionError(f"{package.__name__} defines no face(...)")


def _defined_in(module_name: str) -> set[str]:
    """Names a module binds at its top level itself (def, class, assignment), not by import."""
    path = Path(importlib.import_module(module_name).__file__)
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return out


def _package_modules(package) -> list[str]:
    return [f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)]


def _owner(name: str, value, home: str) -> str | None:
    """The parallelism package that defines ``value``, served by the package ``home`` (None: defined outside
    the packages, e.g. the core)."""
    module = getattr(value, "__module__", None) if (inspect.isclass(value) or inspect.isfunction(value)) else None
    if module is not None:
        parts = module.split(".")
        return parts[2] if module.startswith("distcheck.parallel.") and len(parts) > 3 else None
    for pkg_name, package in sorted(FACES.items(), key=lambda item: item[0] != home):
        if any(name in _defined_in(m) for m in _package_modules(package)):
            return pkg_name
    return None


def test_every_parallelism_package_has_a_face():
    assert set(FACES) >= {"activations", "comm", "dp", "layout", "memory", "params", "pp", "sp", "tp", "zero"}
    for name, package in FACES.items():
        assert isinstance(package.__all__, list) and package.__all__, name
        assert len(set(package.__all__)) == len(package.__all__), f"{name}: a name listed twice"


@pytest.mark.parametrize("name", sorted(FACES))
def test_all_is_exactly_the_public_names(name):
    package = FACES[name]
    expected: set[str] = set()
    for source in _sources(package):
        module = importlib.import_module(f"{package.__name__}.{source}")
        for n in module.__all__:
            owner = _owner(n, getattr(module, n), name)
            if owner in (None, name):
                expected.add(n)
    assert set(package.__all__) == expected
    for n in package.__all__:  # each resolves, and is kept on the package
        getattr(package, n)
    submodules = {m.name for m in pkgutil.iter_modules(package.__path__)}
    assert not set(package.__all__) & submodules, "a public name must not be the name of a module"
    public = {n for n, v in vars(package).items() if not n.startswith("_") and not inspect.ismodule(v)}
    assert public - {"face"} == set(package.__all__)
    assert set(package.__all__) <= set(dir(package))


def _documented(module_name: str, name: str, value) -> bool:
    if inspect.isclass(value) or inspect.isfunction(value):
        doc = value.__doc__ or ""
        return bool(doc.strip()) and not doc.startswith(f"{value.__name__}(")  # a dataclass's generated doc
    for m in [module_name, *(n for n in _package_modules(importlib.import_module(module_name.rpartition(".")[0])))]:
        module = importlib.import_module(m)
        source = Path(module.__file__).read_text()
        lines = source.splitlines()
        for i, line in enumerate(lines):
            if line.startswith((f"{name} =", f"{name}:")) and i and lines[i - 1].lstrip().startswith("#:"):
                return True
        if re.search(rf"(``[^`]*|:data:`)\b{name}\b", module.__doc__ or ""):
            return True
    return False


def test_every_public_name_is_documented():
    undocumented = []
    for package in FACES.values():
        for n in package.__all__:
            value = getattr(package, n)
            home = next(f"{package.__name__}.{s}" for s in _sources(package)
                        if n in importlib.import_module(f"{package.__name__}.{s}").__all__)
            if not _documented(home, n, value):
                undocumented.append(f"{package.__name__}.{n}")
    assert undocumented == []


def test_every_public_object_has_one_public_path():
    import distcheck.mutants as dm
    import distcheck.strategies as ds

    paths: dict[int, list[str]] = {}
    objects = [(f"{p.__name__}.{n}", getattr(p, n)) for p in FACES.values() for n in p.__all__]
    objects += [(f"distcheck.strategies.{n}", getattr(ds, n)) for n in ds.__all__]
    objects += [(f"distcheck.mutants.{m.function.__name__}", m.function) for m in dm.MUTANTS.values()]
    for path, value in objects:
        if inspect.isclass(value) or inspect.isfunction(value):
            paths.setdefault(id(value), []).append(path)
    assert [p for p in paths.values() if len(p) > 1] == []


def test_importing_a_package_imports_nothing_else():
    code = ("import sys, distcheck.parallel.sp, distcheck.parallel.tp, distcheck.parallel.pp.forms; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.endswith('.reference')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_acceptance_command_lists_a_real_api():
    out = subprocess.run([sys.executable, "-c", "import distcheck.parallel.sp as sp; print(sp.__all__)"],
                         capture_output=True, text=True, check=True).stdout
    assert "sp_mlp_block" in out and "reduce_scatter_sequence" in out


def test_a_name_a_package_does_not_serve_is_an_attribute_error():
    with pytest.raises(AttributeError, match="distcheck.parallel.tp"):
        FACES["tp"].no_such_name  # noqa: B018
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert FACES["pp"].simulate("gpipe", p=2, m=2).step_ticks == 9


# ----------------------------------------------------------------------------- findable definitions


def test_every_closed_form_records_where_it_is_defined_and_spells_its_name_there():
    from distcheck.closed_form import catalogue

    unfindable = []
    for name, form in catalogue().items():
        path, _, line = form.where.rpartition(":")
        text = Path(form.file).read_text().splitlines()
        pattern = re.compile(rf"(?<![\w.]){re.escape(name)}(?![\w.])")
        if not (form.module.startswith("distcheck.parallel.") and pattern.search(text[int(line) - 1])):
            unfindable.append(f"{name}: {form.where}")
    assert unfindable == []


def test_one_grep_of_the_listed_name_finds_the_bubble_formula(capsys):
    from distcheck.cli import main

    assert main(["audit", "--list", "--format", "markdown"]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("| `pp.bubble_fraction.gpipe`"))
    where = row.rstrip(" |").rsplit("| ", 1)[-1]
    assert where.startswith("distcheck/parallel/pp/forms.py:")
    root = Path(__file__).resolve().parent.parent
    grep = subprocess.run(["grep", "-rn", '"pp.bubble_fraction.gpipe"', "distcheck"], cwd=root,
                          capture_output=True, text=True).stdout.splitlines()
    assert any(g.startswith(where + ":") for g in grep), grep  # the grep finds the line --list names
    assert main(["audit", "--where", "pp.bubble_fraction.gpipe"]) == 0
    assert capsys.readouterr().out.strip() == where
    assert main(["audit", "--where", "pipeline.bubble_fraction.gpipe"]) == 0  # the old name, as an alias
    assert capsys.readouterr().out.strip() == where


# ----------------------------------------------------------------------------- one name per parallelism

_OLD_KEY = """
[meta]
title = "an answer key written before pipeline parallelism was called pp"
source = "test"

[[claim]]
id = "bubble"
quantity = "pipeline.bubble_fraction.gpipe"
inputs = { p = 4, m = 4 }
claimed = 0.4286
unit = "fraction"
"""


def test_an_old_quantity_name_is_read_as_its_alias_and_the_report_says_so():
    from distcheck.audit import audit_key, parse_key, render

    result = audit_key(parse_key(_OLD_KEY, "old.toml"))
    (v,) = result.claims
    assert v.claim.quantity == "pp.bubble_fraction.gpipe" and v.claim.alias == "pipeline.bubble_fraction.gpipe"
    assert v.verdict == "holds"
    for fmt in ("markdown", "json"):
        text = render(result, fmt)
        assert "the key names pipeline.bubble_fraction.gpipe, the old name of pp.bubble_fraction.gpipe" in text
    current = audit_key(parse_key(_OLD_KEY.replace("pipeline.", "pp."), "new.toml"))
    assert current.claims[0].claim.alias == "" and "old name" not in render(current, "markdown")


def test_no_pipeline_name_is_left_in_the_catalogues():
    from distcheck.closed_form import catalogue
    from distcheck.mutants import MUTANTS
    from distcheck.props import PROOFS, properties, suites

    names = [*catalogue(), *(p.name for p in properties()), *MUTANTS, *PROOFS]
    assert [n for n in names if "pipeline" in n.split(".")] == []
    assert "pp" in suites() and "pipeline" not in suites()
