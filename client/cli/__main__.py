"""``python -m client.cli``: the ``tidelog`` command line, as the console script runs it."""

from __future__ import annotations

import sys

from tidelog.client.cli.program import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
