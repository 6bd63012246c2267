"""``python -m sandbox``: the whole sandbox world as one process (see :mod:`sandbox.host`)."""

from __future__ import annotations

import sys

from sandbox.host import main

if __name__ == "__main__":
    sys.exit(main())
