"""The ``tidelog`` command line run as a subprocess, as a user runs it, for tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "tidelog"]

ROOT = Path(__file__).resolve().parents[1]


def tidelog(
    *args: str, stdin: str | None = None, timeout_s: float = 30
) -> subprocess.CompletedProcess[str]:
    """``tidelog ARGS...`` from the repository root (no ``$TIDELOG_BOOTSTRAP``): its exit
    status, stdout and stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TIDELOG_BOOTSTRAP", None)
    return subprocess.run(
        [sys.executable, "-m", "tidelog.client.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        env=env,
        check=False,
    )
