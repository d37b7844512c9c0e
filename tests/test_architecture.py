"""The shape of the package, held by a test: imports flow one way, no cycles, no long modules.

The import graph of ``distcheck/`` is read statically (``ast``), every import counted,
those inside functions too: a lazy import is still a dependency. Layers, low to high
(a module may import its own layer and the layers below, never one above):

    core < engine < parallel < public < services < stages < entry

- core: ``distcheck.core`` (errors, validation, vocabulary, units, exactness, closed-form
  registry, result rows);
- engine: ``distcheck.engine`` (registry, runner, mutants, proofs, discovery, profiles);
- parallel: ``distcheck.parallel.<name>``, one package per parallelism; a package imports
  another only through that package's ``reference`` module;
- public: the catalogues generated from the packages (``distcheck.closed_form``, ``distcheck.strategies``,
  ``distcheck.mutants``) and the property registry ``distcheck.props``, above the packages they gather;
- services: the world machinery (``runners``), the audit and goldens, plan, figures, reports;
- stages: the one orchestration of ``distcheck check``;
- entry: the command line and the pytest plugin.

The engine reaches the packages above it only by name, through discovery
(``importlib.import_module``), which is not an import edge: that is the point of discovery.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "distcheck"

#: the layers, low to high
LAYERS = ("core", "engine", "parallel", "public", "services", "stages", "entry")

#: the layer of every top-level name of distcheck (a module or a sub-package), declared once
LAYER_OF = {
    "distcheck": "core",  # the package itself: __init__ imports nothing
    "core": "core",
    "engine": "engine",
    "parallel": "parallel",
    "closed_form": "public", "props": "public", "mutants": "public", "strategies": "public",
    "report": "services", "runners": "services", "audit": "services", "golden": "services", "plan": "services",
    "viz": "services", "reportdoc": "services", "progress": "services", "certify": "services", "libs": "services",
    "zoo": "services",
    "stages": "stages",
    "cli": "entry", "pytest_plugin": "entry", "__main__": "entry",
}

MAX_LINES = 500

# Temporary exceptions, each owned by a step of the restructuring that is not merged yet; remove an
# entry when its step lands (the tests below fail when an exception is no longer needed).
#: modules over MAX_LINES (none at present)
KNOWN_LONG: set[str] = set()
#: import edges that close a cycle or point upwards (none at present)
KNOWN_EDGES: set[tuple[str, str]] = set()

#: modules whose layer is not their top-level name's: ``python -m distcheck.runners.torchrun`` is an entry
#: point kept at its public path (it runs the stage orchestration), though it lives among the runners
LAYER_OF_MODULE = {"distcheck.runners.torchrun": "entry"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module (or package) of distcheck that ``name`` refers to, if any."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(name: str, path: Path) -> set[str]:
    """The distcheck modules ``name`` imports, lazily or not (a package's own parents excluded)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")
                base = ".".join(parts[: len(parts) - node.level + (1 if is_package else 0)])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{a.name}" for a in node.names]
        for target in targets:
            if target == "distcheck" or target.startswith("distcheck."):
                resolved = _resolve(target)
                if resolved and resolved != name and not name.startswith(resolved + ".") and resolved != "distcheck":
                    found.add(resolved)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer(module: str) -> str:
    if module in LAYER_OF_MODULE:
        return LAYER_OF_MODULE[module]
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "distcheck"
    return LAYER_OF[top]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _without_known(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: {t for t in targets if (m, t) not in KNOWN_EDGES} for m, targets in graph.items()}


def test_every_top_level_name_has_a_layer():
    tops = {m.split(".")[1] for m in MODULES if m != "distcheck"}
    assert tops <= set(LAYER_OF), f"declare the layer of {sorted(tops - set(LAYER_OF))} in LAYER_OF"
    assert set(LAYER_OF.values()) <= set(LAYERS)


def test_the_walk_sees_lazy_imports_and_every_layer():
    # pinned: a lazy import inside a function is an edge, and the graph spans every layer present
    assert "distcheck.parallel.tp.reference" in GRAPH["distcheck.audit.worked_examples"]  # imported inside _tp()
    assert "distcheck.parallel.dp.reference" in GRAPH["distcheck.parallel.tp.reference"]
    assert {layer(m) for m in MODULES} >= {"core", "engine", "parallel", "public", "services", "entry"}
    assert len(MODULES) > 100


def test_no_import_cycle():
    cycles = _cycles(_without_known(GRAPH))
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_imports_flow_one_way():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = sorted(f"{m} ({layer(m)}) imports {t} ({layer(t)})"
                    for m, targets in _without_known(GRAPH).items() for t in targets
                    if rank[layer(t)] > rank[layer(m)])
    assert upward == [], "imports from a higher layer:\n" + "\n".join(upward)


#: the role modules of a parallelism package (docs/ARCHITECTURE.md), also as ``<topic>_<role>`` companions
ROLES = ("forms", "strategies", "properties", "mutants", "proofs", "contracts", "checks", "findings", "quantities")


def _role(module: str) -> str | None:
    last = module.rsplit(".", 1)[-1]
    return next((r for r in ROLES if last == r or last.endswith("_" + r)), None)


def _reference_modules() -> set[str]:
    """The reference modules of the packages: ``reference`` itself, and every module a reference is split
    into by topic (``tp/heads.py``, ``dp/accumulation.py``): a module of no role that imports nothing
    but the core and other reference modules (the ARCHITECTURE table's import rule for references)."""
    parallel = {m for m in GRAPH if m.startswith("distcheck.parallel.") and len(m.split(".")) > 3}
    found = {m for m in parallel if m.split(".")[3] == "reference"}
    grew = True
    while grew:
        grew = False
        for m in sorted(parallel - found):
            if _role(m) is None and all(t.startswith("distcheck.core") or t in found for t in GRAPH[m]):
                found.add(m)
                grew = True
    return found


def test_parallel_packages_import_each_other_only_through_their_references():
    references = _reference_modules()
    assert {"distcheck.parallel.tp.reference", "distcheck.parallel.tp.heads"} <= references
    assert "distcheck.parallel.tp.contracts" not in references and "distcheck.parallel.tp.forms" not in references
    crossing = []
    for m, targets in GRAPH.items():
        if not m.startswith("distcheck.parallel."):
            continue
        own = m.split(".")[2]
        for t in targets:
            if t.startswith("distcheck.parallel.") and len(t.split(".")) > 2 and t.split(".")[2] != own:
                if t not in references:
                    crossing.append(f"{m} imports {t}")
    assert crossing == [], "\n".join(crossing)


def test_no_module_is_longer_than_the_limit():
    long = sorted(f"{m}: {path.read_text().count(chr(10))} lines" for m, path in MODULES.items()
                  if path.read_text().count("\n") > MAX_LINES and m not in KNOWN_LONG)
    assert long == [], f"modules over {MAX_LINES} lines:\n" + "\n".join(long)


def test_every_known_exception_is_still_needed():
    # an exception that no longer applies must be removed, so the list cannot hide a new case
    assert {m for m in KNOWN_LONG if MODULES[m].read_text().count("\n") <= MAX_LINES} == set()
    assert {e for e in KNOWN_EDGES if e[1] not in GRAPH.get(e[0], set())} == set()


@pytest.mark.parametrize("low", ["core", "engine", "parallel"])
def test_the_lower_layers_never_import_torch_at_module_level(low):
    # torch only inside functions (real-backend checks), so every reference, form and property loads without it
    offenders = []
    for m, path in MODULES.items():
        if layer(m) != low:
            continue
        for node in ast.parse(path.read_text()).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{m}: {n}" for n in names if n == "torch" or n.startswith("torch.")]
    assert offenders == []


def test_importing_distcheck_imports_neither_torch_sympy_nor_numpy():
    code = "import distcheck, sys; print([m for m in ('torch', 'sympy', 'numpy') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


_C901 = re.compile(r"#\s*noqa:\s*C901(?P<rest>.*)$")


def test_complexity_exemptions_are_per_function_each_with_its_reason():
    """No file is exempt from the complexity limit as a whole; each exempt function says why on its ``def`` line."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lint = config["tool"]["ruff"]["lint"]
    whole_files = {f: codes for f, codes in lint.get("per-file-ignores", {}).items() if "C901" in codes}
    assert not whole_files, f"whole files exempt from C901: {whole_files}"
    exempt = []
    for path in sorted((ROOT / "distcheck").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            found = _C901.search(line)
            if found is None:
                continue
            where = f"{path.relative_to(ROOT)}:{n}"
            assert line.lstrip().startswith("def "), f"{where}: a C901 exemption off a def line"
            assert re.fullmatch(r"\s*-\s*\S.{9,}", found.group("rest")), f"{where}: a C901 exemption without its reason"
            exempt.append(where)
    assert exempt, "the walk found no exempt function: the pattern or the tree moved"


def test_no_function_is_over_25_even_where_exempt():
    """An exemption allows a flat table of cases, never a function over 25 (ruff's mccabe, noqa ignored)."""
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.skip(f"ruff is not installed beside {sys.executable} (the test extra installs it)")
    done = subprocess.run([str(ruff), "check", "--select", "C901", "--ignore-noqa", "--output-format", "concise",
                           "--config", "lint.mccabe.max-complexity = 25", "distcheck"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"functions over 25:\n{done.stdout}{done.stderr}"
