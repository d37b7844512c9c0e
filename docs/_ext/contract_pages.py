"""A Sphinx extension that writes one docs page per contract, from the contract registry.

On ``builder-inited`` (before Sphinx reads its sources) it writes ``docs/contracts/<name>.md`` for every
contract that ``distcheck.engine.contracts.contract.contracts()`` finds, the registry that
``distcheck certify --list-contracts`` prints, and removes the page of a contract that is gone. A page states
the contract's name and parallelism, what it checks (its summary), the smallest world on which its claims
can fail and why, its dtypes, each property with its exactness regime and statement, each option with its
kind, default and allowed values, and the contract class's docstring. The pages are generated, never
edited (docs/contracts/ is ignored by git), so they cannot drift from the registry.

Importing the registry needs no torch: CI's docs environment has only the ``docs`` extra.
"""

from __future__ import annotations

import inspect
import os
import tempfile
from pathlib import Path
from typing import Any

#: the folder of the generated pages, under the docs' source folder
FOLDER = "contracts"


def _code(value: object) -> str:
    """``value`` as inline code: its repr (a string option's default shows its quotes)."""
    text = repr(value)
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _option_line(opt: Any) -> str:
    """One option as a Markdown list item: name, kind, default, allowed values, doc."""
    rule = ""
    if opt.choices is not None:
        rule = "; one of " + ", ".join(_code(c) for c in opt.choices)
    elif opt.min_value is not None or opt.max_value is not None:
        rule = f"; from {opt.min_value} to {opt.max_value} (both inclusive)"
    return f"- `{opt.name}` ({opt.kind.__name__}, default {_code(opt.default)}{rule}): {opt.doc}"


def contract_page(contract: Any) -> str:
    """The Markdown (MyST) page of one registered contract (an instance from ``contracts()``)."""
    cls = type(contract)
    lines = [
        f"# {contract.name}",
        "",
        f"{contract.summary}",
        "",
        f"- parallelism: `{contract.parallelism}`",
        f"- dtypes: {', '.join(f'`{d}`' for d in contract.dtypes)}",
        f"- smallest world size: {contract.min_world_size} ({contract.min_world_reason})",
        f"- needs a process group: {'yes' if contract.needs_world else 'no (runs in the calling process)'}",
        f"- defined by: `{cls.__module__}.{cls.__qualname__}`",
        "",
        "```bash",
        f"distcheck certify MODULE:OBJECT --contract {contract.name}",
        "```",
        "",
        "## Properties",
        "",
        "Checked in this order; the regime says how results are compared (`bitwise`, `bounded` by a derived "
        "bound, or `exact` integer arithmetic).",
        "",
    ]
    lines += [f"- `{p.name}` [{p.regime}]: {p.statement}" for p in contract.properties]
    lines += ["", "## Options", ""]
    if contract.options:
        lines += ["Set with `--option NAME=VALUE` on the command line, `options = {...}` in TOML.", ""]
        lines += [_option_line(o) for o in contract.options]
    else:
        lines.append("None.")
    doc = inspect.getdoc(cls)
    if doc:
        fence = "````" if "```" in doc else "```"
        lines += ["", "## The contract's docstring", "", f"{fence}text", doc, fence]
    return "\n".join(lines) + "\n"


def contract_pages() -> dict[str, str]:
    """Every registered contract's page: file name (``<name>.md``) -> its text, in the registry's order."""
    from distcheck.engine.contracts.contract import contracts

    return {f"{c.name}.md": contract_page(c) for c in contracts()}


def write_pages(folder: Path) -> None:
    """Write the pages into ``folder`` (a file only where its text changed, so Sphinx rereads only those;
    each through a temp file then renamed), and remove the ``.md`` files of contracts no longer registered."""
    folder.mkdir(parents=True, exist_ok=True)
    pages = contract_pages()
    for name, text in pages.items():
        path = folder / name
        if path.is_file() and path.read_text() == text:
            continue
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    for stale in folder.glob("*.md"):
        if stale.name not in pages:
            stale.unlink()


def _on_builder_inited(app: Any) -> None:
    write_pages(Path(app.srcdir) / FOLDER)


def setup(app: Any) -> dict:
    app.connect("builder-inited", _on_builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
