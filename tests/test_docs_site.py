"""The docs site (Sphinx with MyST and furo, docs/conf.py): every page is in its table of contents, and it
builds with warnings as errors, its API reference documenting the public surface, with a page per command
(docs/commands/, sphinx-argparse over the CLI's parser) and a page per contract (docs/contracts/, written from
the contract registry by docs/_ext/contract_pages.py).

CI builds the site in a step of its own (`.ci/run`, a virtual environment with the `docs` extra); the build
test here runs where that extra is installed (`pip install -e '.[docs]'`) and says so where it is not.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def toctree_entries(page: str = "index.md") -> list[str]:
    """The documents named by the toctrees of a page of docs/ (docs/index.md by default), in order."""
    text = (DOCS / page).read_text()
    entries: list[str] = []
    for body in re.findall(r"^```\{toctree\}\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        entries += [line.strip() for line in body.splitlines() if line.strip() and not line.startswith(":")]
    return entries


def test_every_page_is_in_the_table_of_contents_once():
    entries = toctree_entries()
    pages = sorted(p.stem for p in DOCS.glob("*.md") if p.name != "index.md")
    assert sorted(entries) == pages, f"docs/index.md's toctrees {sorted(entries)} differ from the pages {pages}"
    assert len(set(entries)) == len(entries)


def test_the_front_page_includes_the_readme_with_its_links_made_relative():
    text = (DOCS / "index.md").read_text()
    assert "```{include} ../README.md\n:relative-docs: docs/\n:relative-images:\n" in text


def command_paths() -> list[tuple[str, ...]]:
    """Every command of ``distcheck`` as its words (``("plan", "memory")``), an alias counted once, from the
    CLI's own parser."""
    import argparse

    from distcheck.cli import build_parser

    paths: list[tuple[str, ...]] = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                seen: set[int] = set()
                for name, sub in action.choices.items():
                    if id(sub) not in seen:  # an alias maps to the parser of its command
                        seen.add(id(sub))
                        paths.append((*path, name))
                        walk(sub, (*path, name))

    walk(build_parser(), ())
    return paths


def test_every_command_has_a_page_generated_from_the_parser():
    paths = command_paths()
    assert ("certify",) in paths and ("plan", "memory") in paths and ("plan", "pipeline") not in paths, paths
    pages = {p.stem for p in (DOCS / "commands").glob("*.md")}
    assert pages == {"-".join(path) for path in paths}, f"docs/commands/ {sorted(pages)} differ from {paths}"
    assert sorted(toctree_entries("COMMANDS.md")) == sorted(f"commands/{p}" for p in pages)
    for path in paths:
        text = (DOCS / "commands" / f"{'-'.join(path)}.md").read_text()
        directive = re.search(r"^```\{eval-rst\}\n\.\. argparse::\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
        assert directive is not None, path
        options = dict(re.findall(r"^ +:([\w-]+):[ ]*(.*)$", directive.group(1), re.MULTILINE))
        assert options["module"] == "distcheck.cli" and options["func"] == "build_parser", (path, options)
        assert options["prog"] == "distcheck" and options["path"] == " ".join(path), (path, options)
        # a command with commands of its own documents only its own options: each has its page
        assert ("nosubcommands" in options) == any(p[:len(path)] == path and p != path for p in paths), path
        assert text.startswith(f"# `distcheck {' '.join(path)}`\n\n") and len(text.split("\n\n")[1]) > 40, path


def _contract_pages_module():
    spec = importlib.util.spec_from_file_location("contract_pages", DOCS / "_ext" / "contract_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_contract_has_a_page_stating_its_properties_options_dtypes_and_smallest_world():
    from distcheck.engine.contracts.contract import contracts

    pages = _contract_pages_module().contract_pages()
    registered = contracts()
    assert list(pages) == [f"{c.name}.md" for c in registered] and len(pages) >= 20
    for c in registered:
        page = pages[f"{c.name}.md"]
        assert page.startswith(f"# {c.name}\n\n{c.summary}\n"), c.name
        assert f"- smallest world size: {c.min_world_size} ({c.min_world_reason})" in page, c.name
        assert f"- dtypes: {', '.join(f'`{d}`' for d in c.dtypes)}\n" in page, c.name
        assert f"- parallelism: `{c.parallelism}`\n" in page, c.name
        for prop in c.properties:
            assert f"- `{prop.name}` [{prop.regime}]: {prop.statement}\n" in page, (c.name, prop.name)
        for opt in c.options:
            assert f"- `{opt.name}` ({opt.kind.__name__}, default `{opt.default!r}`" in page, (c.name, opt.name)
        assert ("None." in page.split("## Options")[1]) == (not c.options), c.name
    row = pages["row-parallel-linear.md"]
    assert "- `split` (str, default `'array_split'`; one of `'array_split'`, `'chunk'`)" in row
    assert "- `k` (int, default `0`; from 0 to 2 (both inclusive))" in pages["moe-layer.md"]


def test_the_contract_pages_are_rewritten_and_a_removed_contracts_page_goes(tmp_path):
    module = _contract_pages_module()
    (tmp_path / "no-such-contract.md").write_text("# gone\n")
    (tmp_path / "row-parallel-linear.md").write_text("# stale\n")
    module.write_pages(tmp_path)
    written = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert written == module.contract_pages()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_site_builds_with_warnings_as_errors_and_documents_the_public_surface(tmp_path):
    missing = [m for m in ("sphinx", "myst_parser", "furo") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: the docs extra (pip install -e '.[docs]'), which CI's docs step has")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-n", "-q", "-b", "html", "docs", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=840, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for page in toctree_entries():
        assert (tmp_path / f"{page}.html").is_file(), page
    for path in command_paths():  # each command's page carries its options, as its --help prints them
        html = (tmp_path / "commands" / f"{'-'.join(path)}.html").read_text()
        assert f"distcheck {' '.join(path)}" in html, path
    assert "--world-sizes" in (tmp_path / "commands" / "certify.html").read_text()
    assert "--list-keys" in (tmp_path / "commands" / "audit.html").read_text()
    from distcheck.engine.contracts.contract import contracts

    for c in contracts():
        html = (tmp_path / "contracts" / f"{c.name}.html").read_text()
        assert all(prop.name in html for prop in c.properties), c.name
    api = (tmp_path / "api.html").read_text()
    for name in ("distcheck.parallel.tp.row_parallel", "distcheck.parallel.step.StepTarget",
                 "distcheck.closed_form.get", "distcheck.props.with_edge_cases", "distcheck.certify.certify",
                 "distcheck.core.errors.ConfigError", "distcheck.core.validate.check_positive_int",
                 "distcheck.pytest_plugin"):
        assert f'id="{name}"' in api or f'id="module-{name}"' in api, name
