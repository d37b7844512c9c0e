"""The documentation's runnable examples run, and give what they show.

Convention, in README.md and docs/*.md: a fenced block runs when the word ``runnable``
follows its language in the info string (GitHub highlights by the first word only).

- ```` ```bash runnable ````: each command (one a line; a trailing ``\\`` continues it; blank
  lines and ``#`` comments are skipped, a comment starts at two spaces and ``#``) runs with
  bash from the repository root and must exit 0, or N when its comment says ``exit N``.
- ```` ```console runnable ````: ``$ command`` lines, each followed by the output it shows.
  The command must exit 0 (or ``exit N`` in its comment), and every shown line must appear
  in its output in the order shown (runs of spaces compare as one space).
- ```` ```python runnable ````: the block runs as one script from the repository root. A line
  ``expression  # -> value`` also asserts the expression's value: ``value`` is a Python
  expression (digits may be grouped with commas, 68,975,329,280; text after two spaces is
  commentary), compared with ``==``, numpy arrays with ``numpy.array_equal``. ``~value`` means
  within half a unit of the value's last digit (``~3e-2``: 0.025 to 0.035).
- ```` ```toml runnable ````: an answer key; ``distcheck audit`` of it must exit 0.

Further words of the info string are pytest markers (``slow``, ``multiprocess``). Each block
runs in a subprocess of its own with a timeout (120 s; 600 s when ``slow``). A block without
``runnable`` never runs: the README's two leading commands, which create virtual environments,
the GPU and multi-node commands, and the full test suite.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
LANGUAGES = {"bash", "console", "python", "toml"}
MARKERS = {"slow", "multiprocess"}
EXIT = re.compile(r"\bexit (\d+)\b")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence
    language: str
    words: tuple[str, ...]
    body: str

    @property
    def runnable(self) -> bool:
        return "runnable" in self.words[1:]

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    text = path.read_text()
    blocks = []
    for m in FENCE.finditer(text):
        words = tuple(m.group(1).split())
        blocks.append(Block(path, text.count("\n", 0, m.start()) + 1, words[0] if words else "", words, m.group(2)))
    return blocks


def runnable_blocks() -> list[Block]:
    return [b for doc in DOCS for b in fenced_blocks(doc) if b.runnable]


def _param(block: Block):
    marks = [getattr(pytest.mark, w) for w in block.words[2:] if w in MARKERS]
    return pytest.param(block, id=block.name, marks=marks)


def _env() -> dict[str, str]:
    """This interpreter's bin folder first on PATH, so ``distcheck`` and ``python`` are this environment's."""
    return {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}


def _timeout(block: Block) -> int:
    return 600 if "slow" in block.words else 120


def _split_comment(line: str) -> tuple[str, str]:
    """``command  # comment`` -> (command, comment); a line that is only a comment has no command."""
    if line.lstrip().startswith("#"):
        return "", line.lstrip()[1:]
    m = re.search(r"\s{2,}#", line)
    return (line[:m.start()], line[m.end():]) if m else (line, "")


def shell_commands(body: str) -> list[tuple[str, int]]:
    """(command, expected exit code) for each command of a bash block."""
    out, pending = [], ""
    for raw in body.splitlines():
        code, comment = _split_comment(raw)
        if pending:
            code = pending + " " + code.strip()
        if code.rstrip().endswith("\\"):
            pending = code.rstrip()[:-1].rstrip()
            continue
        pending = ""
        if code.strip():
            m = EXIT.search(comment)
            out.append((code.strip(), int(m[1]) if m else 0))
    return out


def console_steps(body: str) -> list[tuple[str, int, list[str]]]:
    """(command, expected exit code, shown output lines) for each ``$ `` line of a console block."""
    steps: list[tuple[str, int, list[str]]] = []
    for raw in body.splitlines():
        if raw.startswith("$ "):
            code, comment = _split_comment(raw[2:])
            m = EXIT.search(comment)
            steps.append((code.strip(), int(m[1]) if m else 0, []))
        elif steps and raw.strip():
            steps[-1][2].append(raw)
    return steps


def _squash(line: str) -> str:
    return " ".join(line.split())


def _run(cmd: list[str], block: Block, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=_timeout(block),
                          check=False, **kwargs)


_CHECK = '''
def __shown__(value, shown, line):
    import re
    from decimal import Decimal
    from fractions import Fraction
    import numpy as np
    text = re.sub(r"(?<=\\d),(?=\\d{3}\\b)", "", shown)
    if text.startswith("~"):
        written = Decimal(text[1:])
        ok = abs(Decimal(float(value)) - written) <= Decimal(1).scaleb(written.as_tuple().exponent) / 2
    else:
        expected = eval(text, {"Fraction": Fraction, "np": np})
        if isinstance(value, np.ndarray) or isinstance(expected, np.ndarray):
            ok = np.array_equal(value, expected)
        else:
            ok = value == expected
    if not ok:
        raise AssertionError(f"line {line}: the doc shows {shown}, the code gives {value!r}")
'''


def python_script(block: Block) -> str:
    """The block with each ``expression  # -> value`` line turned into a check of that value."""
    lines = []
    for n, raw in enumerate(block.body.splitlines(), start=block.line + 1):
        m = re.match(r"^(?P<indent>\s*)(?P<code>\S.*?)\s+# -> (?P<shown>.*)$", raw)
        if m is None:
            lines.append(raw)
            continue
        shown = m["shown"].split("  ")[0].strip()
        ast.parse(m["code"], mode="eval")  # a value is shown for an expression only
        lines.append(f"{m['indent']}__shown__(({m['code']}), {shown!r}, {n})")
    return _CHECK + "\n".join(lines) + "\n"


BLOCKS = runnable_blocks()


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_runnable_block(block: Block, tmp_path):
    assert block.language in LANGUAGES, f"{block.name}: no runner for {block.language!r} blocks"
    if block.language == "bash":
        commands = shell_commands(block.body)
        assert commands, f"{block.name}: a runnable block without a command"
        for cmd, expected in commands:
            proc = _run(["bash", "-c", cmd], block)
            assert proc.returncode == expected, f"{block.name}: `{cmd}` exited {proc.returncode}, not {expected}:\n" \
                                                f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    elif block.language == "console":
        steps = console_steps(block.body)
        assert steps, f"{block.name}: a runnable block without a $ command"
        for cmd, expected, shown in steps:
            proc = _run(["bash", "-c", cmd], block)
            assert proc.returncode == expected, \
                f"{block.name}: `{cmd}` exited {proc.returncode}:\n{proc.stderr[-2000:]}"
            got = [_squash(line) for line in proc.stdout.splitlines()]
            at = 0
            for line in shown:
                want = _squash(line)
                assert want in got[at:], \
                    f"{block.name}: `{cmd}` does not print {line!r} (in this order):\n{proc.stdout}"
                at = got.index(want, at) + 1
    elif block.language == "python":
        proc = _run([sys.executable, "-c", python_script(block)], block)
        assert proc.returncode == 0, f"{block.name}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    else:  # toml: an answer key
        key = tmp_path / "key.toml"
        key.write_text(block.body)
        proc = _run([sys.executable, "-m", "distcheck", "audit", str(key)], block)
        assert proc.returncode == 0, f"{block.name}: distcheck audit exited {proc.returncode}:\n" \
                                     f"{proc.stdout[-3000:]}{proc.stderr[-2000:]}"


def test_readme_set_up_commands_are_not_run():
    first = fenced_blocks(ROOT / "README.md")[0]
    assert "python3 -m venv" in first.body and not first.runnable
    assert not any("-m venv" in b.body for b in BLOCKS)


def test_every_document_has_runnable_examples():
    per_doc = {doc.name: sum(b.doc == doc for b in BLOCKS) for doc in DOCS}
    assert all(per_doc[name] for name in ("README.md", "AUDIT.md", "PROPERTIES.md", "RUNNERS.md")), per_doc


def test_the_harness_reads_commands_exit_codes_and_shown_values():
    assert shell_commands("a --x   # exit 1: why\n# note\nb \\\n  --y  # more\n\n") == [("a --x", 1), ("b --y", 0)]
    assert console_steps("$ cmd  # exit 2\nout 1\n\nout  2\n$ other\n") == [("cmd", 2, ["out 1", "out  2"]),
                                                                             ("other", 0, [])]
    block = Block(ROOT / "README.md", 10, "python", ("python", "runnable"),
                  "x = 3\nx * 7   # -> 21  (commentary)\nx / 100  # -> ~3e-2\n[x] * 2  # -> [3, 3]\n")
    assert _run([sys.executable, "-c", python_script(block)], block).returncode == 0
    wrong = Block(ROOT / "README.md", 10, "python", ("python", "runnable"), "7 * 1_000_000  # -> 7,000,001\n")
    proc = _run([sys.executable, "-c", python_script(wrong)], wrong)
    assert proc.returncode == 1 and "line 11: the doc shows 7,000,001, the code gives 7000000" in proc.stderr
    far = Block(ROOT / "README.md", 10, "python", ("python", "runnable"), "0.036  # -> ~3e-2\n")
    assert _run([sys.executable, "-c", python_script(far)], far).returncode == 1


# ---- what the README says about the code, held by the code

def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def layout_entries() -> dict[str, str]:
    """The README's repository layout: path -> its description (continuation lines joined)."""
    body = FENCE.search(_readme_section("Repository layout"), re.MULTILINE)
    assert body is not None, "the repository layout section has no code block"
    entries: dict[str, str] = {}
    last = ""
    for line in body.group(2).splitlines():
        m = re.match(r"^(\S+)\s{2,}(.*)$", line)
        if m:
            last = m[1]
            entries[last] = m[2]
        elif line.strip():
            entries[last] += " " + line.strip()
    return entries


def _entry_of(path: Path, entries: dict[str, str]) -> str:
    """The most specific layout entry that holds ``path``."""
    rel = path.relative_to(ROOT).as_posix()
    holders = [e for e in entries if rel == e.rstrip("/") or rel.startswith(e if e.endswith("/") else e + "/")]
    assert holders, f"{rel} is in no entry of the README's repository layout"
    return max(holders, key=len)


def test_every_path_of_the_readme_layout_exists_and_the_parallel_packages_are_listed():
    entries = layout_entries()
    assert len(entries) >= 15, entries
    for path in entries:
        assert (ROOT / path).exists(), f"the README's repository layout names {path}, which does not exist"
    listed = re.search(r"one package per parallelism \(([^)]*)\)", entries["distcheck/parallel/"])
    assert listed is not None
    packages = {p.parent.name for p in (ROOT / "distcheck" / "parallel").glob("*/__init__.py")}
    assert {x.strip() for x in listed[1].split(",")} == packages
    for role in ("reference", "forms", "strategies", "properties", "mutants", "proofs", "contracts", "checks"):
        assert role in entries["distcheck/parallel/"] and list((ROOT / "distcheck" / "parallel").glob(f"*/{role}.py"))


def test_the_readme_layout_places_contracts_and_ddp_where_they_are():
    entries = layout_entries()
    contracts = [p for p in (ROOT / "distcheck").rglob("*.py")
                 if re.search(r"^class \w+\([\w.]*Contract\)", p.read_text(), re.MULTILINE)]
    ddp = [p for p in (ROOT / "distcheck").rglob("*.py")
           if re.search(r"import DistributedDataParallel\b", p.read_text())]
    assert len(contracts) >= 8 and ddp
    for module in contracts:
        entry = _entry_of(module, entries)
        assert re.search(r"\bcontract", entries[entry], re.I), f"{module.relative_to(ROOT)}: {entry} {entries[entry]!r}"
    holders = {_entry_of(module, entries) for module in ddp}
    assert {e for e, text in entries.items() if re.search(r"\bDDP\b", text)} == holders, holders


def test_every_registered_property_declares_edge_cases_that_hold():
    from distcheck.props import properties

    assert "Each\n   property declares its edge cases" in _readme_section("`distcheck check`")
    for prop in properties():
        edges = tuple(prop.edge_cases())
        assert edges, f"{prop.name} declares no edge cases"
        for case in edges:
            prop.check(case, None)  # each holds on the reference


def test_the_readme_says_how_many_ranks_of_the_fake_world_are_checked():
    import inspect

    from distcheck.parallel.layout.checks import fake_mesh_rows, sample_ranks

    text = " ".join(_readme_section("`distcheck check`").split())
    m = re.search(r"a ([\d,]+)-rank world on the fake backend, of which (\d+) ranks are impersonated", text)
    assert m is not None, "the README must say how many ranks of the fake world the check impersonates"
    defaults = {k: v.default for k, v in inspect.signature(fake_mesh_rows).parameters.items()
                if k in ("pp", "dp", "tp")}
    assert int(m[1].replace(",", "")) == defaults["pp"] * defaults["dp"] * defaults["tp"]
    assert int(m[2]) == len(sample_ranks(**defaults))


def _list_items(text: str) -> list[str]:
    """The items of every numbered list (``1. ...`` and its indented lines), outside code blocks."""
    items: list[str] = []
    current: list[str] | None = None
    for line in FENCE.sub("", text).splitlines():
        if re.match(r"^\d+\. ", line):
            current = [line]
            items.append("")
        elif current is not None and (line.startswith("   ") or not line.strip()):
            current.append(line)
        else:
            current = None
        if current is not None:
            items[-1] = " ".join(current)
    return items


def test_no_numbered_step_of_the_docs_says_a_thing_twice():
    # a step pasted twice in an edit leaves a run of words repeated inside the one item
    for doc in DOCS:
        for item in _list_items(doc.read_text()):
            words = re.findall(r"[\w./`<>-]+", item.lower())
            runs = [tuple(words[i:i + 7]) for i in range(len(words) - 6)]
            repeated = {" ".join(r) for r in runs if runs.count(r) > 1}
            assert not repeated, f"{doc.name}: a numbered step repeats {sorted(repeated)[:2]}: {item[:200]}"
