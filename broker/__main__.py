"""``python -m broker``: the broker daemon, same arguments as ``tidelog serve``."""

from __future__ import annotations

import sys

from tidelog.broker.cli import main

if __name__ == "__main__":
    sys.exit(main())
