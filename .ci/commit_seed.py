"""Print the seed of CI's exploratory run: distcheck.engine.profiles.commit_seed of a commit.

    python .ci/commit_seed.py            # the checkout's HEAD (`git rev-parse HEAD`)
    python .ci/commit_seed.py REVISION   # a commit named by its object name, e.g. a CI system's SHA

The seed is the integer value of the first 8 hex digits of the object name. `.ci/run` passes it to
`distcheck check --profile dev --seed N` and to pytest's `--hypothesis-seed N`, so every commit
searches new examples and the same two commands replay its run. Exit 2, one line on stderr, when
the revision is not an object name or HEAD cannot be read.
"""

import subprocess
import sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(root))

from distcheck.core.errors import ConfigError  # noqa: E402 - after the checkout is on sys.path
from distcheck.engine.profiles import commit_seed  # noqa: E402

if len(sys.argv) > 2:
    sys.exit("usage: commit_seed.py [REVISION]")
if len(sys.argv) == 2:
    revision = sys.argv[1]
else:
    try:
        revision = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                  check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"commit_seed.py: cannot read the commit of {root} (git rev-parse HEAD): {e}", file=sys.stderr)
        sys.exit(2)
try:
    print(commit_seed(revision))
except ConfigError as e:
    print(f"commit_seed.py: {e}", file=sys.stderr)
    sys.exit(2)
