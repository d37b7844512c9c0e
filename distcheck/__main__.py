import sys

from distcheck.cli import main

sys.exit(main())
