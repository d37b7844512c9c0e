"""One table of bad input, run through the real command line: every row exits 2 with one line on
stderr that names the field, and no traceback. The table grows with the parsers: every option flag
of every subcommand (read from :func:`distcheck.cli.build_parser` itself) has at least one row,
or takes no value and is listed in :data:`NO_VALUE` with the reason.

Rows run in this process through :func:`distcheck.cli.main` (fast); rows that could hang (a named
pipe read or written) run in a subprocess under a timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distcheck.cli import build_parser, main

DIGITS_60 = "9" * 60
DIGITS_5000 = "9" * 5000
PP = "examples.my_pipeline_schedules:one_f_one_b"
CERT = ["certify", PP, "--contract", "pipeline-table", "--option", "schedule=1f1b"]
MEMORY = ["plan", "memory", "--model", "llama-3-8b", "--gpus", "8"]
SHAPE = ["plan", "memory", "--gpus", "8", "--hidden-size", "64", "--num-layers", "2", "--ffn-hidden-size", "128",
         "--num-heads", "4", "--num-kv-heads", "4", "--vocab-size", "100"]
#: explicit MoE sizes appended to SHAPE (4 experts, top-2, expert FFN 32)
MOE = ["--num-experts", "4", "--experts-per-token", "2", "--expert-ffn", "32"]
PIPE = ["plan", "pp", "--p", "4", "--m", "8"]
TIME = ["plan", "time", "--model", "llama-3-8b", "--gpus", "8"]
TSHAPE = ["plan", "time", *SHAPE[2:]]
LAYOUT = ["plan", "layout", "--tp", "2", "--pp", "2", "--dp", "2"]

ENTRY = f'[[tool.distcheck.certify]]\ntarget = "{PP}"\ncontract = "pipeline-table"\noptions = {{ schedule = "1f1b" }}\n'
#: pyproject.toml texts, by name: ``{cfg:NAME}`` in a row's argv is the path of a file holding it
CONFIGS = {
    "timeout-nan": f"[tool.distcheck]\ntimeout = nan\n{ENTRY}",
    "timeout-inf": f"[tool.distcheck]\ntimeout = inf\n{ENTRY}",
    "timeout-1e400": f"[tool.distcheck]\ntimeout = 1e400\n{ENTRY}",
    "timeout-0": f"[tool.distcheck]\ntimeout = 0\n{ENTRY}",
    "timeout-neg": f"[tool.distcheck]\ntimeout = -1\n{ENTRY}",
    "ws-empty": f"[tool.distcheck]\nworld-sizes = []\n{ENTRY}",
    "ws-dup": f"[tool.distcheck]\nworld-sizes = [2, 2]\n{ENTRY}",
    "ws-str": f'[tool.distcheck]\nworld-sizes = ["a"]\n{ENTRY}',
    "seed-long": f"[tool.distcheck]\nseed = {DIGITS_5000}\n{ENTRY}",
    "examples-long": f"[tool.distcheck]\nexamples = {DIGITS_5000}\n{ENTRY}",
    "seed-neg": f"[tool.distcheck]\nseed = -1\n{ENTRY}",
    "profile": f'[tool.distcheck]\nprofile = "fast"\n{ENTRY}',
    "backend": f'[tool.distcheck]\nbackend = "mpi"\n{ENTRY}',
    "tool-int": "[tool]\ndistcheck = 1\n",
    "tool-not-table": "tool = 1\n",
    "entry-type": f"{ENTRY}examples = 'x'\n",
    "entry-option": ENTRY.replace('schedule = "1f1b"', 'schedule = "1f1b", max_stages = 1000000'),
    "entry-dtypes": f'{ENTRY}dtypes = ["float8"]\n',
    "not-toml": "[tool.distcheck\n",
    "timeout-str": '[tool.distcheck]\ntimeout = "x"\n',
}


def _fs(tmp_path: Path) -> dict[str, str]:
    """The odd files a row may name: a named pipe, a folder, a dangling link, a regular file, a link."""
    fifo, folder, dangling = tmp_path / "pipe.json", tmp_path / "folder.json", tmp_path / "dangling.toml"
    os.mkfifo(fifo)
    folder.mkdir()
    dangling.symlink_to(tmp_path / "missing.toml")
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    link = tmp_path / "link.json"
    link.symlink_to(plain)
    ro = tmp_path / "ro.json"
    ro.write_text("x")
    ro.chmod(0o444)
    ro_dir = tmp_path / "ro-dir"
    ro_dir.mkdir()
    ro_dir.chmod(0o555)
    out = {"fifo": str(fifo), "dir": str(folder), "dangling": str(dangling), "file": str(plain), "link": str(link),
           "ro": str(ro), "ro-dir": str(ro_dir)}
    big = tmp_path / "big.toml"  # a config over the 4 MiB cap: refused before a byte is parsed
    big.touch()
    os.truncate(big, 4 * 2**20 + 1)
    out["cfg-big"] = str(big)
    out["cfg-missing"] = str(tmp_path / "missing" / "pyproject.toml")
    binary = tmp_path / "binary.toml"  # not UTF-8: a compiled file named by mistake
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe" + bytes(range(256)))
    out["cfg-binary"] = str(binary)
    for name, text in CONFIGS.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        out[f"cfg:{name}"] = str(path)
    for name, make in (("bad", lambda p: p.write_text("not toml [\n")),
                       ("big", lambda p: os.truncate(p, 4 * 2**20 + 1) if p.touch() is None else None),
                       ("fifo", os.mkfifo)):
        folder_g = tmp_path / f"golden-{name}"
        folder_g.mkdir()
        make(folder_g / "key.toml")
        out[f"golden:{name}"] = str(folder_g)
    return out


#: (flag the row is for, argv, text the one line must hold, runs in a subprocess)
ROWS: list[tuple[str, list[str], str, bool]] = [
    # ---- check
    ("check --profile", ["check", "--profile", "fast"], "--profile", False),
    ("check --seed", ["check", "--seed", "-1"], "--seed", False),
    ("check --seed", ["check", "--seed", DIGITS_5000], "--seed", False),
    ("check --backend", ["check", "--backend", "mpi"], "--backend", False),
    ("check --world-sizes", ["check", "--world-sizes", "2,2"], "--world-sizes", False),
    ("check --world-sizes", ["check", "--world-sizes", DIGITS_5000], "--world-sizes", False),
    ("check --launcher", ["check", "--launcher", "mpirun"], "--launcher", False),
    ("check --only", ["check", "--only", "nope"], "--only", False),
    ("check --skip", ["check", "--skip", "nope"], "--skip", False),
    ("check --golden-dir", ["check", "--golden-dir", "/nonexistent/golden"], "--golden-dir", False),
    ("check --golden-dir", ["check", "--only", "golden", "--golden-dir", "{golden:bad}"], "key.toml", False),
    ("check --golden-dir", ["check", "--only", "golden", "--golden-dir", "{golden:big}"], "key.toml", False),
    ("check --golden-dir", ["check", "--only", "golden", "--golden-dir", "{golden:fifo}"], "key.toml", True),
    ("check --golden-dir", ["check", "--only", "golden", "--golden-dir", "{dir}"], "--golden-dir", False),
    ("check --timeout", ["check", "--timeout", "nan"], "--timeout", False),
    ("check --format", ["check", "--format", "xml"], "--format", False),
    ("check --report", ["check", "--only", "golden", "--report", "{file}"], "plain.txt", False),
    ("check --report", ["check", "--only", "golden", "--report", "{link}"], "symbolic link", False),
    ("check --report", ["check", "--only", "golden", "--report", "{ro-dir}"], "read-only", False),
    # ---- audit
    ("audit --format", ["audit", "chapter", "--format", "xml"], "--format", False),
    ("audit --output", ["audit", "chapter", "--output", "{dir}"], "--output", False),
    ("audit --output", ["audit", "chapter", "--output", "{link}"], "symbolic link", False),
    ("audit --output", ["audit", "chapter", "--output", "{ro}"], "read-only", False),
    ("audit --output", ["audit", "chapter", "--output", "{fifo}"], "named pipe", True),
    ("audit --report", ["audit", "chapter", "--report", "{file}"], "plain.txt", False),
    ("audit --where", ["audit", "--where", "pp.bubble_fractoin.gpipe"], "--where='pp.bubble_fractoin.gpipe' must "
                                                                         "name a closed form", False),
    # ---- plan memory
    ("plan memory --model", [*MEMORY[:2], "--gpus", "8", "--model", "llama-3-8b\n"], "model", False),
    ("plan memory --model", [*MEMORY[:2], "--gpus", "8", "--model", "llama-3-8b\x1b[2J"], "model", False),
    ("plan memory --params", [*MEMORY[:2], "--gpus", "8", "--params", "abc"], "params", False),
    ("plan memory --sort", [*MEMORY, "--sort", "fastest"], "--sort", False),
    ("plan memory --sort", [*MEMORY, "--tp", "2", "--sort", "memory"], "--sort", False),
    ("plan memory --hidden-size", [*SHAPE, "--hidden-size", "0"], "hidden_size", False),
    ("plan memory --num-layers", [*SHAPE, "--num-layers", "0"], "num_layers", False),
    ("plan memory --ffn-hidden-size", [*SHAPE, "--ffn-hidden-size", "0"], "ffn_hidden_size", False),
    ("plan memory --num-heads", [*SHAPE, "--num-heads", "3"], "num_heads", False),
    ("plan memory --num-kv-heads", [*SHAPE, "--num-kv-heads", "3"], "num_kv_heads", False),
    ("plan memory --vocab-size", [*SHAPE, "--vocab-size", "0"], "vocab_size", False),
    ("plan memory --gpus", [*MEMORY[:4], "--gpus", "0"], "gpus", False),
    ("plan memory --gpus", [*MEMORY[:4], "--gpus", DIGITS_5000], "--gpus", False),
    ("plan memory --gpus-per-node", [*MEMORY, "--gpus-per-node", "0"], "gpus_per_node", False),
    ("plan memory --gpu-memory", [*MEMORY, "--gpu-memory", f"{DIGITS_60}GB"], "gpu_memory", False),
    ("plan memory --gpu-memory", [*MEMORY, "--gpu-memory", f"{DIGITS_5000}GB"], "gpu_memory", False),
    ("plan memory --gpu-memory", [*MEMORY, "--gpu-memory", "80"], "gpu_memory", False),
    ("plan memory --gpu-memory", [*MEMORY, "--gpu-memory", "2 PB"], "gpu_memory", False),
    ("plan memory --reserve", [*MEMORY, "--reserve", f"{DIGITS_60}GB"], "reserve", False),
    ("plan memory --reserve", [*MEMORY, "--reserve", "90 GB"], "reserve", False),
    ("plan memory --seq-len", [*MEMORY, "--seq-len", "0"], "seq_len", False),
    ("plan memory --num-experts", [*SHAPE, "--num-experts", "0", *MOE[2:]], "num_experts", False),
    ("plan memory --experts-per-token", [*SHAPE, *MOE[:2], "--experts-per-token", "5", *MOE[4:]],
     "k=5 must be at most num_experts=4", False),
    ("plan memory --expert-ffn", [*SHAPE, *MOE[:4], "--expert-ffn", "0"], "expert_ffn", False),
    ("plan memory --dense-layers", [*SHAPE, *MOE, "--dense-layers", "3"], "dense_layers", False),
    ("plan memory --dense-ffn", [*SHAPE, *MOE, "--dense-layers", "1", "--dense-ffn", "0"], "dense_ffn", False),
    ("plan memory --shared-experts", [*SHAPE, *MOE, "--shared-experts", "-1"], "shared_experts", False),
    ("plan memory --ep", [*SHAPE, *MOE, "--ep", "0"], "ep=0", False),
    ("plan memory --ep", [*SHAPE, *MOE, "--ep", "3"], "ep=3", False),
    ("plan memory --ep", [*SHAPE, "--ep", "2"], "--ep", False),
    ("plan memory --micro-batch", [*MEMORY, "--micro-batch", "0"], "micro_batch", False),
    ("plan memory --num-microbatches", [*MEMORY, "--num-microbatches", "0"], "num_microbatches", False),
    ("plan memory --recompute", [*MEMORY, "--recompute", "some"], "--recompute", False),
    ("plan memory --bytes-per-param", [*MEMORY, "--bytes-per-param", "fp4"], "--bytes-per-param", False),
    ("plan memory --schedule", [*MEMORY, "--schedule", "dualpipe"], "--schedule", False),
    ("plan memory --tp", [*MEMORY, "--tp", "3", "--pp", "1", "--dp", "1"], "tp", False),
    ("plan memory --pp", [*MEMORY, "--tp", "1", "--pp", "0", "--dp", "8"], "pp", False),
    ("plan memory --dp", [*MEMORY, "--tp", "1", "--pp", "1", "--dp", "0"], "dp", False),
    ("plan memory --cp", [*MEMORY, "--tp", "1", "--pp", "1", "--dp", "8", "--cp", "0"], "cp", False),
    ("plan memory --zero", [*MEMORY, "--tp", "1", "--pp", "1", "--dp", "8", "--zero", "5"], "zero", False),
    ("plan memory --top", [*MEMORY, "--top", "0"], "top", False),
    ("plan memory --format", [*MEMORY, "--format", "xml"], "--format", False),
    ("plan memory --figure", [*MEMORY, "--figure", "chart.txt"], "figure", False),
    ("plan memory --report", [*MEMORY, "--report", "{file}"], "plain.txt", False),
    # ---- plan time
    ("plan time --model", [*TIME[:2], "--gpus", "8", "--model", "gpt-9"], "model", False),
    ("plan time --model", [*TIME[:2], "--gpus", "8", "--model", "mixtral-8x7b"], "is a mixture-of-experts", False),
    ("plan time --params", [*TIME[:2], "--gpus", "8", "--params", "13e9"], "--params", False),
    ("plan time --hidden-size", [*TSHAPE, "--hidden-size", "0"], "hidden_size", False),
    ("plan time --num-layers", [*TSHAPE, "--num-layers", "0"], "num_layers", False),
    ("plan time --ffn-hidden-size", [*TSHAPE, "--ffn-hidden-size", "0"], "ffn_hidden_size", False),
    ("plan time --num-heads", [*TSHAPE, "--num-heads", "3"], "num_heads", False),
    ("plan time --num-kv-heads", [*TSHAPE, "--num-kv-heads", "3"], "num_kv_heads", False),
    ("plan time --vocab-size", [*TSHAPE, "--vocab-size", "0"], "vocab_size", False),
    ("plan time --gpus", [*TIME[:4], "--gpus", "0"], "gpus", False),
    ("plan time --hardware", [*TIME, "--hardware", "tpu-v4"], "--hardware", False),
    ("plan time --hw", [*TIME, "--hw", "peak_flops=fast"], "--hw peak_flops", False),
    ("plan time --hw", [*TIME, "--hw", "clock=2GHz"], "--hw", False),
    ("plan time --gpus-per-node", [*TIME, "--gpus-per-node", "0"], "--gpus-per-node", False),
    ("plan time --gpu-memory", [*TIME, "--gpu-memory", "80"], "--gpu-memory", False),
    ("plan time --reserve", [*TIME, "--reserve", "90 GB"], "reserve", False),
    ("plan time --seq-len", [*TIME, "--seq-len", "0"], "seq_len", False),
    ("plan time --micro-batch", [*TIME, "--micro-batch", "0"], "micro_batch", False),
    ("plan time --num-microbatches", [*TIME, "--num-microbatches", "0"], "num_microbatches", False),
    ("plan time --recompute", [*TIME, "--recompute", "some"], "--recompute", False),
    ("plan time --bytes-per-param", [*TIME, "--bytes-per-param", "fp4"], "--bytes-per-param", False),
    ("plan time --schedule", [*TIME, "--schedule", "dualpipe"], "--schedule", False),
    ("plan time --global-batch", [*TIME, "--global-batch", "0"], "--global-batch", False),
    ("plan time --compute-efficiency", [*TIME, "--compute-efficiency", "1.5"], "--compute-efficiency", False),
    ("plan time --overlap", [*TIME, "--overlap", "tp=backward"], "--overlap", False),
    ("plan time --top", [*TIME, "--top", "0"], "top", False),
    ("plan time --format", [*TIME, "--format", "xml"], "--format", False),
    ("plan time --figure", [*TIME, "--figure", "chart.txt"], "figure", False),
    ("plan time --report", [*TIME, "--report", "{file}"], "plain.txt", False),
    # ---- plan pp
    ("plan pp --p", ["plan", "pp", "--p", "0", "--m", "8"], "p", False),
    ("plan pp --m", ["plan", "pp", "--p", "4", "--m", "0"], "m", False),
    ("plan pp --schedule", [*PIPE, "--schedule", "zigzag"], "--schedule", False),
    ("plan pp --v", [*PIPE, "--schedule", "interleaved", "--v", "1"], "v", False),
    ("plan pp --t-f", [*PIPE, "--t-f", "0"], "t_f", False),
    ("plan pp --t-b", [*PIPE, "--t-b", "0"], "t_b", False),
    ("plan pp --torch", [*PIPE, "--torch", "NoSuchSchedule"], "--torch", False),
    ("plan pp --format", [*PIPE, "--format", "xml"], "--format", False),
    ("plan pp --figure", [*PIPE, "--figure", "chart.txt"], "figure", False),
    ("plan pp --report", [*PIPE, "--report", "{file}"], "plain.txt", False),
    # ---- plan layout
    ("plan layout --tp", ["plan", "layout", "--tp", "0"], "tp", False),
    ("plan layout --pp", ["plan", "layout", "--pp", "0"], "pp", False),
    ("plan layout --dp", ["plan", "layout", "--dp", "0"], "dp", False),
    ("plan layout --cp", ["plan", "layout", "--cp", "0"], "cp", False),
    ("plan layout --gpus-per-node", [*LAYOUT, "--gpus-per-node", "0"], "gpus_per_node", False),
    ("plan layout --format", [*LAYOUT, "--format", "xml"], "--format", False),
    ("plan layout --figure", [*LAYOUT, "--figure", "chart.txt"], "figure", False),
    ("plan layout --report", [*LAYOUT, "--report", "{file}"], "plain.txt", False),
    # ---- certify
    ("certify --contract", ["certify", PP, "--contract", "pipeline-tabel"], "pipeline-tabel", False),
    ("certify --world-sizes", [*CERT, "--world-sizes", "0"], "--world-sizes", False),
    ("certify --backend", [*CERT, "--backend", "mpi"], "--backend", False),
    ("certify --examples", [*CERT, "--examples", "0"], "--examples", False),
    ("certify --batch", [*CERT, "--batch", "1000000000000"], "--batch", False),
    ("certify --report", [*CERT, "--report", "{file}"], "plain.txt", False),
    ("certify --seed", [*CERT, "--seed", "-1"], "--seed", False),
    ("certify --profile", [*CERT, "--profile", "fast"], "--profile", False),
    ("certify --dtypes", [*CERT, "--dtypes", "float8"], "dtypes", False),
    ("certify --dtypes", [*CERT, "--dtypes", "float64,,float32"], "empty item", False),
    ("certify --option", [*CERT, "--option", "max_stages=1000000"], "max_stages", False),
    ("certify --option", [*CERT, "--option", "max_stages=-1"], "max_stages", False),
    ("certify --option", [*CERT, "--option", "v=100"], "option v", False),
    ("certify --option", [*CERT, "--option", "max_stages"], "--option", False),
    ("certify --option", [*CERT, "--option", "no_such=1"], "no_such", False),
    ("certify --certificate", [*CERT, "--certificate", "{fifo}"], "--certificate", True),
    ("certify --certificate", [*CERT, "--certificate", "{dir}"], "--certificate", False),
    ("certify --certificate", [*CERT, "--certificate", "{link}"], "--certificate", False),
    ("certify --certificate", [*CERT, "--certificate", "{ro}"], "read-only", False),
    ("certify --certificate", [*CERT, "--certificate", "cert.txt"], "--certificate", False),
    ("certify --launcher", [*CERT, "--launcher", "mpirun"], "--launcher", False),
    ("certify --timeout", [*CERT, "--timeout", "nan"], "--timeout", False),
    ("certify --config", ["certify", "--config", "{fifo}"], "--config", True),
    ("certify --config", ["certify", "--config", "/dev/zero"], "--config", True),
    ("certify --config", ["certify", "--config", "{dangling}"], "--config", False),
    ("certify --config", ["certify", "--config", "{dir}"], "--config", False),
    ("certify --config", ["certify", "--config", "{cfg-big}"], "config-file limit", False),
    *[("certify --config", ["certify", "--config", f"{{cfg:{name}}}"], needle, False) for name, needle in (
        ("timeout-nan", "timeout=nan"), ("timeout-inf", "timeout=inf"), ("timeout-1e400", "timeout=inf"),
        ("timeout-0", "timeout=0"), ("timeout-neg", "timeout=-1"), ("ws-empty", "world-sizes=[]"),
        ("ws-dup", "world-sizes=[2, 2]"), ("ws-str", "world-sizes"), ("seed-long", "seed="),
        ("examples-long", "examples="), ("seed-neg", "seed=-1"), ("profile", "profile='fast'"),
        ("backend", "backend='mpi'"), ("tool-int", "tool.distcheck=1"), ("tool-not-table", "tool=1"),
        ("entry-type", "examples='x'"), ("entry-option", "max_stages=1000000"), ("entry-dtypes", "float8"),
        ("not-toml", "not valid TOML"))],
    # ---- certify --config with a target: the file is read and checked all the same (it used to be ignored)
    ("certify --config", [*CERT, "--config", "{fifo}"], "--config", True),
    ("certify --config", [*CERT, "--config", "{cfg-missing}"], "cannot be read", False),
    ("certify --config", [*CERT, "--config", "{cfg-binary}"], "is not UTF-8 text", False),
    ("certify --config", [*CERT, "--config", "{dir}"], "--config", False),
    *[("certify --config", [*CERT, "--config", f"{{cfg:{name}}}"], needle, False) for name, needle in (
        ("not-toml", "not valid TOML"), ("timeout-nan", "timeout=nan"), ("timeout-str", "timeout='x' must be an int"),
        ("ws-str", "world-sizes"), ("seed-neg", "seed=-1"), ("backend", "backend='mpi'"),
        ("tool-not-table", "tool=1"), ("entry-type", "examples='x'"), ("entry-option", "max_stages=1000000"))],
    ("certify --format", [*CERT, "--format", "xml"], "--format", False),
    # ---- libs
    ("libs --target", ["libs", "--target", "nope"], "--target", False),
    ("libs --examples", ["libs", "--examples", "0"], "--examples", False),
    ("libs --seed", ["libs", "--seed", "-1"], "--seed", False),
    ("libs --format", ["libs", "--format", "xml"], "--format", False),
    # ---- zoo (refused before any entry runs)
    ("zoo --entry", ["zoo", "--entry", "nope", "--list", "--dir", str(Path(__file__).resolve().parent.parent / "zoo")],
     "--entry='nope' must be one of the entries", False),
    ("zoo --dir", ["zoo", "--dir", "/nonexistent", "--list"], "--dir='/nonexistent' must be the zoo/ folder", False),
    ("zoo --seed", ["zoo", "--seed", "-1"], "--seed", False),
    ("zoo --format", ["zoo", "--format", "xml"], "--format", False),
]

#: flags that take no value, so no bad value can be given: each with the reason it has no row
NO_VALUE = {
    "--help": "prints the help and exits 0; takes no value",
    "--version": "prints the version and exits 0; takes no value",
    "--quiet": "a switch: hides the progress lines; takes no value",
    "--list": "a switch: lists the quantities; its misuse with a KEY.toml is a row of tests/test_cli.py",
    "--list-keys": "a switch: lists the shipped keys; its misuse is a row of tests/test_cli.py",
    "--all": "a switch: shows every layout; takes no value",
    "--sequence-parallel": "a switch (and --no-sequence-parallel); takes no value",
    "--list-contracts": "a switch: lists the contracts; takes no value",
    "--require-installed": "a switch: a missing library is an error (the default now); takes no value",
    "--allow-skips": "a switch: a missing library is a skip row; takes no value (tests/test_libs_contracts.py)",
    "--strict": "a switch: audit fails unless every claim is decided (tests/test_cli.py); takes no value",
}


def _expand(argv: list[str], files: dict[str, str]) -> list[str]:
    out = []
    for arg in argv:
        if arg.startswith("{") and arg.endswith("}") and arg[1:-1] in files:
            arg = files[arg[1:-1]]
        out.append(arg)
    return out


def _assert_one_line_exit_2(code: int, err: str, needle: str) -> None:
    assert code == 2, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-2000:]
    assert needle in lines[0], lines[0][:2000]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flag, argv, needle, subprocess_only", ROWS,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(ROWS)])
def test_bad_input_exits_2_with_one_line_naming_the_field(flag, argv, needle, subprocess_only, tmp_path,
                                                         monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no pyproject.toml of this checkout is read; outputs land here
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))  # examples/ imports
    argv = _expand(argv, _fs(tmp_path))
    if subprocess_only:  # a named pipe or a device: a regression would hang or read forever, not fail
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                           os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run([sys.executable, "-m", "distcheck", *argv], capture_output=True, text=True,
                              timeout=90, env=env)
        _assert_one_line_exit_2(proc.returncode, proc.stderr, needle)
        return
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors exit through the parser
        code = exc.code
    _assert_one_line_exit_2(code, capsys.readouterr().err, needle)


def _flags(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(subcommand path, option flag, the action) for every option of every (sub)parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():  # an alias (plan pipeline, the old plan pp) is its parser again
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from _flags(sub, (*path, name))
        elif action.option_strings:
            yield " ".join(path), next(s for s in action.option_strings if s.startswith("--")), action


def test_every_flag_of_every_subcommand_has_a_bad_input_row():
    covered = {r[0] for r in ROWS}
    missing, wrongly_exempt = [], []
    for path, flag, action in _flags(build_parser()):
        name = f"{path} {flag}".strip()
        if name in covered:
            continue
        if flag in NO_VALUE:
            if action.nargs != 0:
                wrongly_exempt.append(name)  # it takes a value: give it a row instead
            continue
        missing.append(name)
    assert not missing, f"add a bad-input row to tests/test_bad_input.py for: {', '.join(missing)}"
    assert not wrongly_exempt, f"these take a value, so they need a row, not an exemption: {wrongly_exempt}"
    known = {f"{p} {f}".strip() for p, f, _ in _flags(build_parser())}
    assert covered <= known, f"rows for flags that no longer exist: {sorted(covered - known)}"


def test_every_int_option_of_every_contract_declares_its_range():
    from distcheck.engine.contracts.contract import contracts

    unbounded = [f"{c.name}: {o.name}" for c in contracts() for o in c.options
                 if o.kind is int and (o.min_value is None or o.max_value is None)]
    assert not unbounded, f"declare min_value and max_value on: {', '.join(unbounded)}"


# ----------------------------------------------------------------------------- the torchrun environment

TORCHRUN = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variable, value", [
    ("WORLD_SIZE", DIGITS_5000), ("RANK", DIGITS_5000), ("LOCAL_RANK", "-1"), ("MASTER_PORT", "abc"),
    ("MASTER_PORT", "99999"), ("MASTER_PORT", "0"), ("MASTER_PORT", DIGITS_5000),
    ("MASTER_ADDR", "no-such-host.invalid"), ("MASTER_ADDR", ""),
])
@pytest.mark.parametrize("command", [["check", "--launcher", "torchrun", "--only", "distributed"],
                                     [*CERT, "--launcher", "torchrun"]], ids=["check", "certify"])
def test_a_bad_torchrun_environment_is_one_line_naming_the_variable(variable, value, command, monkeypatch, capsys):
    for k, v in {**TORCHRUN, variable: value}.items():
        monkeypatch.setenv(k, v)
    try:
        code = main(command)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    _assert_one_line_exit_2(code, err, variable)
    assert len(err) < 400  # a 5,000-digit value is shown by its length, not echoed


def test_an_address_that_does_not_resolve_in_time_is_refused(monkeypatch):
    import socket
    import threading

    from distcheck.core.errors import ConfigError
    from distcheck.runners.torchrun_world import check_master

    release = threading.Event()
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: release.wait(30))  # a resolver that never answers
    try:
        with pytest.raises(ConfigError, match=r"MASTER_ADDR='slow.example' did not resolve within 0.2 s"):
            check_master({"MASTER_ADDR": "slow.example", "MASTER_PORT": "29500"}, required=True,
                         resolve_timeout_s=0.2)
    finally:
        release.set()
