"""The docs site (Sphinx with MyST and furo, docs/conf.py): every page is in its table of contents, and it
builds with warnings as errors, its API reference documenting the public surface.

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


def toctree_entries() -> list[str]:
    """The documents named by the toctrees of docs/index.md, in order."""
    text = (DOCS / "index.md").read_text()
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
    api = (tmp_path / "api.html").read_text()
    for name in ("distcheck.parallel.tp.row_parallel", "distcheck.parallel.step.StepTarget",
                 "distcheck.closed_form.get", "distcheck.props.with_edge_cases", "distcheck.certify.certify",
                 "distcheck.core.errors.ConfigError", "distcheck.core.validate.check_positive_int",
                 "distcheck.pytest_plugin"):
        assert f'id="{name}"' in api or f'id="module-{name}"' in api, name
