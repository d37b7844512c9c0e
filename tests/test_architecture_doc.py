"""docs/ARCHITECTURE.md matches the code: every package under ``distcheck/parallel/`` is named in its layer
list and its public surface, every closed-form prefix of the catalogue has its line among the catalogue
names, and every role module its table names exists (and every module name that several packages share
is in the table)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARALLEL = ROOT / "distcheck" / "parallel"
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def _packages() -> set[str]:
    return {p.name for p in PARALLEL.iterdir() if (p / "__init__.py").is_file()}


def _names(text: str) -> set[str]:
    return {n.strip() for n in text.replace("\n", " ").split(",") if n.strip()}


def test_the_layer_list_names_every_parallelism_package():
    found = re.search(r"^ {4}parallel +distcheck/parallel/<name>/: (.*?)\n {4}engine ", DOC, re.S | re.M)
    assert found is not None, "the layer list has no parallel line"
    assert _names(found.group(1)) == _packages()


def test_the_public_surface_names_every_parallelism_package():
    found = re.search(r"\*\*`distcheck\.parallel\.<name>` is the API of a parallelism\*\* \((.*?)\)", DOC, re.S)
    assert found is not None, "the public surface has no list of packages"
    assert _names(found.group(1)) == _packages()


def test_the_role_table_names_modules_that_exist_and_every_shared_one():
    table = DOC[DOC.index("| role | what | imports |"):]
    table = table[:table.index("\n\n")]
    roles = re.findall(r"^\| `(\w+)\.py` \|", table, re.M)
    assert roles, "no role table"
    for role in roles:  # each names a module some package has
        assert any((PARALLEL / p / f"{role}.py").is_file() for p in _packages()), f"{role}.py exists in no package"
    shared = Counter(f.stem for p in _packages() for f in (PARALLEL / p).glob("*.py") if f.stem != "__init__")
    assert {name for name, n in shared.items() if n >= 2} <= set(roles)  # a module several packages share is a role


def test_every_closed_form_prefix_has_its_catalogue_line():
    from distcheck.closed_form import catalogue

    section = DOC[DOC.index("Catalogue names"):DOC.index("## Runners and stages")]
    listed = " ".join(re.findall(r"^- .*$", section, re.M))
    for name in catalogue():
        head, rest = name.split(".", 1)
        # a name is listed whole, or with its last parts in braces (`pp.bubble_fraction.{gpipe,1f1b}`)
        assert f"`{head}." in listed, f"no catalogue line names {head}.* ({name})"
