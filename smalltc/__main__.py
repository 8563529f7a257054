"""``python -m smalltc``: the same command line as ``smalltc`` (see :mod:`smalltc.cli`)."""
import sys

from smalltc.cli import main

if __name__ == "__main__":
    sys.exit(main())
