"""Print one of the README's two leading commands ("main" or "test").

CI runs exactly what the README says, so the README's commands stay true.
"""

import re
import sys
from pathlib import Path

text = Path(__file__).resolve().parent.parent.joinpath("README.md").read_text()
block = re.search(r"```(?:bash|sh)?\n(.*?)```", text, re.S)
if block is None:
    sys.exit("README.md has no command block")
lines = [ln.strip() for ln in block.group(1).splitlines() if ln.strip() and not ln.strip().startswith("#")]
if len(lines) != 2:
    sys.exit(f"README.md's first command block must hold exactly two commands, found {len(lines)}")
which = sys.argv[1] if len(sys.argv) > 1 else "test"
print(lines[0] if which == "main" else lines[1])
