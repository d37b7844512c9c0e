"""Sphinx configuration of distcheck's docs site.

Sphinx with MyST (myst-parser) and the furo theme: the toolchain of pytest and Hypothesis, the two
libraries distcheck is used beside, so the site reads like theirs. MyST keeps the sources Markdown: the
same files GitHub renders, whose runnable blocks and ``# exit N`` commands tests/test_docs.py runs.
The API reference is autodoc over the public surface (docs/api.md).

Build (CI does, warnings as errors)::

    pip install -e '.[docs]'
    sphinx-build -W -n -b html docs docs/_build
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # autodoc imports distcheck from the checkout
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))  # contract_pages: a page per contract

import distcheck  # noqa: E402

project = "distcheck"
author = "distcheck's authors"
release = version = distcheck.__version__

# sphinxarg.ext (sphinx-argparse): a page per command, from distcheck.cli.build_parser (docs/commands/);
# contract_pages (docs/_ext/): a page per contract, written from the registry before the sources are read
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinxarg.ext", "contract_pages"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "repro", "_ext"]
root_doc = "index"

html_theme = "furo"
html_title = f"distcheck {release}"

# Markdown: the headings get GitHub's anchors, so the pages' links (CERTIFY.md#the-first-divergence) resolve
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]
# links to files of the repository outside docs/ (examples/README.md, a module): written for GitHub, where
# they resolve; the site has no page for them
# suppress_warnings = ["myst.xref_missing"]

# the API reference: signatures as written, the docstrings' own prose for types
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}

# a public enum's private base (distcheck.core.vocab._Name, a StrEnum) has no page of its own
nitpick_ignore_regex = [("py:class", r"distcheck\.[\w.]*\._\w+")]


def _verbatim(app, what, name, obj, options, lines) -> None:
    """Show a docstring as written, in a literal block. distcheck's docstrings are plain text for ``help()``
    and the terminal (aligned tables, indented examples, ``code`` and :role:`names` written inline), not
    reStructuredText: parsed as reST their tables and examples break, and their short names (``PROOFS``,
    ``MAX_LOCAL_RANKS``) point nowhere. The signature and the module, class and member structure are
    autodoc's."""
    if lines:
        lines[:] = ["::", "", *(("    " + line) if line.strip() else "" for line in lines), ""]


def setup(app) -> dict:
    app.connect("autodoc-process-docstring", _verbatim)
    return {"parallel_read_safe": True}
