"""``python -m smalltc``: the same command line as ``smalltc`` (see :mod:`smalltc.app.cli`)."""
import sys

from smalltc.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
