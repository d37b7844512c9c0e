"""One import path per public name: no module of distcheck exists only to re-export another's names.

Read from the source with ``ast`` (nothing is imported, so the modules of optional extras count too).
A name listed in a module's ``__all__`` is a public name of that module, and that module must be its
one path:

- a module lists only what it defines itself (``def``, ``class``, an assignment at its top level);
- except a *face*, which serves the names of modules that are its own: a package's ``__init__``
  serving its submodules (``distcheck.runners`` serves ``distcheck.runners.pool`` ...; every
  parallelism package ``distcheck.parallel.<name>`` serves its internal modules through
  ``distcheck.core.face.face``), and the four catalogues generated from the packages
  (:data:`CATALOGUES`), which serve the engine's machinery and every package's forms, strategies,
  properties and mutants;
- a module that defines nothing of its own (imports and ``__all__``, a ``from ... import *``, or a
  ``__getattr__`` that hands out another module's names) and is not a face is a re-export: it fails.

The owners: errors and validators are :mod:`distcheck.core.errors` and :mod:`distcheck.core.validate`;
units, exactness and atomic writes :mod:`distcheck.core.units`, :mod:`distcheck.core.exactness`,
:mod:`distcheck.core.atomic`; the Hypothesis profiles :mod:`distcheck.engine.profiles`; a parallelism's
references its package; a closed form ``distcheck.closed_form.get(name)``; a property
``distcheck.props.get(name)``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "distcheck"
#: the catalogues generated from the packages: each serves the engine's machinery and what every package registers
CATALOGUES = {"distcheck.closed_form", "distcheck.props", "distcheck.strategies", "distcheck.mutants"}
#: faces that serve names of modules outside their own package: the catalogues, and the certify API (its own
#: modules and the contract machinery of ``distcheck.engine.contracts``, which the packages' contracts build on)
FACES = CATALOGUES | {"distcheck.certify"}
#: attributes a module may bind besides its own names
DUNDERS = {"__all__", "__getattr__", "__dir__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, tuple[Path, ast.Module]]:
    return {_module_name(p): (p, ast.parse(p.read_text())) for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, (ast.Tuple, ast.List)):
        return {n for e in node.elts for n in _targets(e)}
    return set()


def defined(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level itself, not by import."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {n for t in node.targets for n in _targets(t)}
        elif isinstance(node, ast.AnnAssign):
            out |= _targets(node.target)
    return out - DUNDERS


def listed(tree: ast.Module) -> list[str] | None:
    """The module's ``__all__`` when it is a literal list (None when it is computed, [] when absent)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and "__all__" in {n for t in node.targets for n in _targets(t)}:
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:
                return None
    return []


def imported(tree: ast.Module, module: str) -> dict[str, str]:
    """name bound by a top-level ``from X import name`` -> X (made absolute)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if _is_package(module) else 0)]
                source = ".".join([*base, source] if source else base)
            for alias in node.names:
                out[alias.asname or alias.name] = source
    return out


def _is_package(module: str) -> bool:
    return (PACKAGE.parent / module.replace(".", "/") / "__init__.py").is_file()


def is_face(module: str, tree: ast.Module) -> bool:
    """A package serving its own modules (by import or through ``face(...)``), or a catalogue."""
    if module in FACES:
        return True
    if not _is_package(module) or module == "distcheck":
        return False
    calls_face = any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "face" for n in ast.walk(tree))
    sources = set(imported(tree, module).values()) - {"__future__", "distcheck.core.face", "typing", "collections.abc"}
    return calls_face or bool(sources) and all(s.startswith(module + ".") for s in sources)


def _internal(module: str, found: dict[str, tuple[Path, ast.Module]]) -> bool:
    """A module inside a parallelism package, whose face (``distcheck.parallel.<name>``, through
    ``distcheck.core.face.face``) is its one public path: its ``__all__`` lists what the face serves."""
    parts = module.split(".")
    return len(parts) > 3 and parts[1] == "parallel" and ".".join(parts[:3]) in found


def problems() -> list[str]:
    out = []
    found = modules()
    for module, (path, tree) in found.items():
        if is_face(module, tree) or _internal(module, found):
            continue
        where = path.relative_to(ROOT)
        stars = [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)]
        if stars:
            out.append(f"{where}: re-exports {stars[0]} whole (from ... import *)")
            continue
        names = listed(tree) or []
        own = defined(tree)
        hands_out = any(isinstance(n, (ast.Assign, ast.FunctionDef)) and "__getattr__" in
                        ({getattr(n, "name", None)} | {x for t in getattr(n, "targets", []) for x in _targets(t)})
                        for n in tree.body)
        if not own and (names or hands_out) and module != "distcheck.__main__":
            out.append(f"{where}: defines nothing; it only serves another module's names")
            continue
        sources = imported(tree, module)
        for name in names:
            if name not in own and name != "__version__":
                out.append(f"{where}: lists {name} in __all__, which {sources.get(name, 'another module')} defines")
    return out


def test_every_public_name_has_one_import_path():
    found = problems()
    assert not found, "\n".join(found)


def test_the_owners_of_the_core_names_are_the_paths_they_are_imported_from():
    mods = modules()
    for gone in ("distcheck.errors", "distcheck.validate", "distcheck.units", "distcheck.exactness",
                 "distcheck.atomic", "distcheck.profiles", "distcheck.forms", "distcheck.tp", "distcheck.props.tp"):
        assert gone not in mods, f"{gone} re-exports names another module owns"
    errors = set(listed(mods["distcheck.core.errors"][1]) or [])
    validate = set(listed(mods["distcheck.core.validate"][1]) or [])
    assert {"ConfigError", "DistcheckError", "PropertyFailure"} <= errors
    assert {"check_positive_int", "check_divides", "check_choice", "check_int"} <= validate and not errors & validate


def test_the_rule_flags_a_re_export_a_star_import_and_a_moved_module(tmp_path, monkeypatch):
    # the three shapes of a re-export, each caught; a module that defines its names, and a face, pass
    pkg = tmp_path / "distcheck"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0'\n")
    (pkg / "owner.py").write_text("__all__ = ['f']\ndef f():\n    pass\n")
    (pkg / "again.py").write_text("from distcheck.owner import f\n__all__ = ['f']\n")
    (pkg / "star.py").write_text("from distcheck.owner import *  # noqa\nfrom distcheck.owner import __all__\n")
    (pkg / "moved.py").write_text("from distcheck.x import moved\n__getattr__ = moved('a', 'b', 'c')\n")
    (pkg / "mixed.py").write_text("from distcheck.owner import f\n__all__ = ['f', 'g']\ndef g():\n    pass\n")
    (pkg / "sub" / "__init__.py").write_text("from distcheck.sub.inner import h\n__all__ = ['h']\n")
    (pkg / "sub" / "inner.py").write_text("__all__ = ['h']\ndef h():\n    pass\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    assert sorted(problems()) == [
        "distcheck/again.py: defines nothing; it only serves another module's names",
        "distcheck/mixed.py: lists f in __all__, which distcheck.owner defines",
        "distcheck/moved.py: defines nothing; it only serves another module's names",
        "distcheck/star.py: re-exports distcheck.owner whole (from ... import *)",
    ]


def test_every_world_target_of_the_library_adapters_resolves_on_its_module():
    # a target is written module:attr (distcheck.libs.targets.torchtitan:MOE); an adapter that serves one defined
    # elsewhere keeps it bound, outside its __all__
    import importlib

    from distcheck.libs.targets import TARGETS

    runs = [(module, run.attr) for module in TARGETS.values()
            for run in getattr(importlib.import_module(f"distcheck.libs.targets.{module}"), "WORLD_CERTIFY", ())]
    assert len(runs) >= 10 and {("torchtitan", "MOE"), ("deepspeed", "MOE"), ("torchtitan", "LLAMA")} <= set(runs)
    for module, attr in runs:
        assert hasattr(importlib.import_module(f"distcheck.libs.targets.{module}"), attr), f"{module}:{attr}"
