"""`python3 -m loom <subcommand>`: the same command line as `./loom`."""

import sys

from loom.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
