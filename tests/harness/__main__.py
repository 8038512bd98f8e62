"""``python -m tests.harness check | test [pytest arguments]`` (tests/harness/run.py)."""

import sys

from tests.harness.run import main

try:
    sys.exit(main(sys.argv[1:]))
except KeyboardInterrupt:
    sys.exit(130)
