"""examples/README.md stays true: every command names a target that imports and a registered contract,
with options the contract knows (the verdicts themselves are pinned by the world tests it names)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = [line.split("#", 1)[0].strip() for line in (ROOT / "examples" / "README.md").read_text().splitlines()
            if line.startswith("distcheck certify ")]


def test_the_examples_readme_lists_every_example_module():
    named = {c.split()[2].split(":")[0] for c in COMMANDS}
    on_disk = {f"examples.{p.stem}" for p in (ROOT / "examples").glob("*.py")}
    assert on_disk <= named, sorted(on_disk - named)
    assert len(COMMANDS) == len(set(COMMANDS)), "a command is listed twice"


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_names_a_target_and_a_contract_that_exist(command):
    pytest.importorskip("torch")
    from distcheck.engine.contracts.contract import get_contract
    from distcheck.engine.contracts.targets import import_target

    args = shlex.split(command)[2:]
    target, contract = args[0], args[args.index("--contract") + 1]
    if "fairscale" in target:
        pytest.importorskip("fairscale")  # the optional extra
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import_target(target)
    c = get_contract(contract)
    options = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--option")
    c.parse_options(options)  # an unknown option or a bad value raises
    assert re.fullmatch(r"[a-z-]+", contract)
