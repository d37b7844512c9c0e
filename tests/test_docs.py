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
``runnable`` does not run as a block: the README's two leading commands, which create virtual
environments, the GPU and multi-node commands, and the full test suite.

Every command of any other shell block (``bash``, ``sh``, ``shell``) of these documents and of
examples/README.md whose trailing comment starts with ``exit N`` (``# exit 0``, ``# exit 1: why``)
runs all the same, found by :func:`documented_commands` (one ``slow`` test each, named
``doc:line`` of its first line): exactly as written (its ``\\``-continued lines joined), with bash,
from the checkout's root, this environment's ``distcheck`` first on PATH, and must exit N. A
command that needs what this machine lacks, read from the command itself (``--backend nccl``
without CUDA, a target of an optional extra that is not installed, ``distcheck libs`` without its
libraries), is skipped with that reason (:func:`missing_for`), never run and passed. The files it
writes (``--certificate``, ``--report``, ``--output``, ``--figure``) are removed after it, and a file
of the same name that was there is put back.
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


def shell_lines(body: str) -> list[tuple[int, str, str]]:
    """(line of the command's first line in ``body``, counted from 0; the command; its trailing comment)
    for each command of a bash block: a line ending in ``\\`` continues on the next (joined with one space,
    as the shell's tokens see it), blank lines and ``#`` comment lines are skipped."""
    out, pending, first = [], "", 0
    for n, raw in enumerate(body.splitlines()):
        code, comment = _split_comment(raw)
        if pending:
            code = pending + " " + code.strip()
        else:
            first = n
        if code.rstrip().endswith("\\"):
            pending = code.rstrip()[:-1].rstrip()
            continue
        pending = ""
        if code.strip():
            out.append((first, code.strip(), comment))
    return out


def shell_commands(body: str) -> list[tuple[str, int]]:
    """(command, expected exit code) for each command of a bash block."""
    out = []
    for _, code, comment in shell_lines(body):
        m = EXIT.search(comment)
        out.append((code, int(m[1]) if m else 0))
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


# ---- every documented command that states its exit code runs as written

#: the documents whose commands are run: the docs above and examples/README.md
EXIT_DOCS = [*DOCS, ROOT / "examples" / "README.md"]
SHELLS = {"bash", "sh", "shell"}
#: a trailing comment that states the command's exit code: ``# exit 0``, ``# exit 1: 30 passed``
STATED_EXIT = re.compile(r"^\s*exit (\d+)\b")
#: flags whose value is a file or folder a command writes (removed after the run, or restored if it was there)
OUTPUT_FLAGS = ("--certificate", "--report", "--output", "--figure")
#: seconds one documented command may take (the training-step and checkpoint lines take minutes on 2 cores)
COMMAND_TIMEOUT_S = 1500


@dataclass(frozen=True)
class DocCommand:
    doc: Path
    line: int  # the command's first line in the document
    command: str  # its lines joined, without the comment
    exit_code: int  # the code its comment states

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def documented_commands(docs: list[Path] = EXIT_DOCS) -> list[DocCommand]:
    """Each command of a shell block (not ``runnable``: test_runnable_block runs those) whose trailing comment
    starts with ``exit N``."""
    out = []
    for doc in docs:
        for block in fenced_blocks(doc):
            if block.language not in SHELLS or block.runnable:
                continue
            for offset, command, comment in shell_lines(block.body):
                m = STATED_EXIT.match(comment)
                if m:
                    out.append(DocCommand(doc, block.line + 1 + offset, command, int(m[1])))
    return out


def _extras() -> dict[str, str]:
    """distribution (lower case) -> the pyproject.toml extra that installs it."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower(): name for name, reqs in extras.items()
            for req in reqs}


def _not_installed(dist: str) -> str | None:
    """Why ``dist`` is missing here (naming its extra), or None when it is installed."""
    import importlib.metadata

    try:
        importlib.metadata.version(dist)
        return None
    except importlib.metadata.PackageNotFoundError:
        extra = _extras().get(dist.lower())
        how = f"the {extra} extra: pip install -e '.[{extra}]'" if extra else f"pip install {dist}"
        return f"needs {dist} ({how}), which is not installed here"


def missing_for(command: str) -> str | None:
    """Why ``command`` cannot run here, read from the command itself, or None when it can: a GPU backend
    without CUDA, a target whose module is not installed (an optional extra), ``distcheck libs`` without its
    libraries (unless ``--allow-skips``)."""
    import importlib.util
    import shlex

    words = shlex.split(command)
    backend = next((w.split("=", 1)[1] for w in words if w.startswith("--backend=")), None)
    backend = backend or next((b for a, b in zip(words, words[1:], strict=False) if a == "--backend"), None)
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            return "needs CUDA GPUs (--backend nccl); this machine has none"
    for i, word in enumerate(words[:-1]):
        if word != "distcheck":
            continue
        sub = words[i + 1]
        if sub == "libs" and "--allow-skips" not in words:
            from distcheck.libs import TARGET_NAMES
            from distcheck.libs.targets import target

            chosen = [b for a, b in zip(words, words[1:], strict=False) if a == "--target"] or TARGET_NAMES
            for name in chosen:
                if (why := _not_installed(target(name).DIST)) is not None:
                    return why
        if sub == "certify" and i + 2 < len(words) and ":" in words[i + 2]:
            module = words[i + 2].split(":", 1)[0]
            if module.startswith("distcheck.libs.targets."):
                from distcheck.libs.targets import target

                if (why := _not_installed(target(module.rsplit(".", 1)[1]).DIST)) is not None:
                    return why
            elif importlib.util.find_spec(module.split(".")[0]) is None:
                return _not_installed(module.split(".")[0]) or f"needs {module}, which does not import here"
    return None


def _outputs(command: str) -> list[Path]:
    """The files and folders ``command`` writes (the values of :data:`OUTPUT_FLAGS`), from the checkout's root."""
    import shlex

    words, out = shlex.split(command), []
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if flag in OUTPUT_FLAGS:
            value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            if value:
                out.append(ROOT / value)
    return out


def _run_as_written(command: str, tmp_path: Path) -> tuple[int, str]:
    """Run ``command`` with bash from the checkout's root, this environment's ``distcheck`` first on PATH;
    (exit code, the output's tail). The command and every process it starts run in a session of their own,
    killed together if it runs past :data:`COMMAND_TIMEOUT_S`. What it writes is removed after, and a file of
    the same name that was there before is put back."""
    import shutil
    import signal

    saved = []
    for path in _outputs(command):
        if path.exists() or path.is_symlink():
            keep = tmp_path / f"saved-{len(saved)}"
            shutil.move(path, keep)
            saved.append((path, keep))
        else:
            saved.append((path, None))
    proc = subprocess.Popen(["bash", "-c", command], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        try:
            out, _ = proc.communicate(timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"`{command}` did not finish in {COMMAND_TIMEOUT_S} s:\n{out[-3000:]}")
    finally:
        for path, keep in saved:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
            if keep is not None:
                shutil.move(keep, path)
    return proc.returncode, out[-4000:]


DOC_COMMANDS = documented_commands()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(COMMAND_TIMEOUT_S + 60)
@pytest.mark.parametrize("doc", [pytest.param(c, id=c.name) for c in DOC_COMMANDS])
def test_documented_command_exits_as_its_comment_says(doc: DocCommand, tmp_path):
    why = missing_for(doc.command)
    if why is not None:
        pytest.skip(f"{doc.name}: {why}")
    code, out = _run_as_written(doc.command, tmp_path)
    assert code == doc.exit_code, f"{doc.name}: `{doc.command}` exited {code}, the doc says {doc.exit_code}:\n{out}"


def test_the_documented_commands_are_found_joined_and_skipped_by_what_they_need(tmp_path):
    names = {c.name: c for c in DOC_COMMANDS}
    # the README's multi-line line: joined, its comment on the last line, numbered from the first
    row = next(c for c in DOC_COMMANDS if "--certificate row.json" in c.command)
    assert row.command == ("distcheck certify examples.my_tp_layers:RowParallelLinear --contract row-parallel-linear "
                           "--world-sizes 2,4 --certificate row.json --certificate row.md") and row.exit_code == 0
    assert (ROOT / "README.md").read_text().splitlines()[row.line - 1].startswith(
        "distcheck certify examples.my_tp_layers:RowParallelLinear")
    assert {c.exit_code for c in DOC_COMMANDS} == {0, 1, 2} and len(names) == len(DOC_COMMANDS) >= 12
    for line in ("distcheck certify examples.my_step:parallelize --contract training-step --world-sizes 4",
                 "distcheck certify distcheck.parallel.checkpoint.plans:TORCH_DCP --contract checkpoint "
                 "--world-sizes 2,4"):
        assert any(c.command == line and c.exit_code == 0 for c in DOC_COMMANDS), line
    assert not any("distcheck audit chapter" in c.command for c in DOC_COMMANDS)  # a runnable block's: run there
    doc = tmp_path / "doc.md"
    doc.write_text("```bash\nrun a   # exit 0\nrun b \\\n  --x   # exit 1: why\nrun c  # a note: exit 2\n"
                   "```\n\n```bash runnable\nrun d   # exit 0\n```\n\n```python\nx = 1  # exit 0\n```\n")
    found = documented_commands([doc])
    assert [(c.line, c.command, c.exit_code) for c in found] == [(2, "run a", 0), (3, "run b --x", 1)]
    # what CI lacks is read from the command: skipped with the reason, never run and passed
    import importlib.util

    import torch

    nccl = missing_for("distcheck check --backend nccl --world-sizes 2")
    assert (nccl is None) if torch.cuda.is_available() else ("CUDA" in (nccl or ""))

    if importlib.util.find_spec("fairscale") is None:
        why = missing_for("distcheck certify fairscale.nn.model_parallel.layers:RowParallelLinear --contract x")
        assert why is not None and "pip install -e '.[fairscale]'" in why
    assert missing_for("distcheck certify examples.my_tp_layers:RowParallelLinear --contract row-parallel-linear") \
        is None
    assert _outputs("distcheck certify a:b --certificate x.json --report=out --world-sizes 2") == [
        ROOT / "x.json", ROOT / "out"]


# ---- what the docs say about the code, held by the code

def _page(name: str) -> str:
    """A page of docs/ (the README's sections moved there keep their headings: docs/REPOSITORY.md is
    "Repository layout", docs/CHECK.md "`distcheck check`")."""
    return (ROOT / "docs" / name).read_text()


def layout_entries() -> dict[str, str]:
    """The repository layout (docs/REPOSITORY.md): path -> its description (continuation lines joined)."""
    body = FENCE.search(_page("REPOSITORY.md"), re.MULTILINE)
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
    assert holders, f"{rel} is in no entry of the repository layout (docs/REPOSITORY.md)"
    return max(holders, key=len)


def test_every_path_of_the_repository_layout_exists_and_the_parallel_packages_are_listed():
    entries = layout_entries()
    assert len(entries) >= 15, entries
    for path in entries:
        assert (ROOT / path).exists(), f"docs/REPOSITORY.md names {path}, which does not exist"
    listed = re.search(r"one package per parallelism \(([^)]*)\)", entries["distcheck/parallel/"])
    assert listed is not None
    packages = {p.parent.name for p in (ROOT / "distcheck" / "parallel").glob("*/__init__.py")}
    assert {x.strip() for x in listed[1].split(",")} == packages
    for role in ("reference", "forms", "strategies", "properties", "mutants", "proofs", "contracts", "checks"):
        assert role in entries["distcheck/parallel/"] and list((ROOT / "distcheck" / "parallel").glob(f"*/{role}.py"))


def test_the_repository_layout_places_contracts_and_ddp_where_they_are():
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

    assert "Each\n   property declares its edge cases" in _page("CHECK.md")
    for prop in properties():
        edges = tuple(prop.edge_cases())
        assert edges, f"{prop.name} declares no edge cases"
        for case in edges:
            prop.check(case, None)  # each holds on the reference


def test_the_docs_say_how_many_ranks_of_the_fake_world_are_checked():
    import inspect

    from distcheck.parallel.layout.checks import fake_mesh_rows, sample_ranks

    text = " ".join(_page("CHECK.md").split())
    m = re.search(r"a ([\d,]+)-rank world on the fake backend, of which (\d+) ranks are impersonated", text)
    assert m is not None, "docs/CHECK.md must say how many ranks of the fake world the check impersonates"
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
