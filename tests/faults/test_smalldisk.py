"""``tests.faults.smalldisk``: a broker's tmpfs fills to ENOSPC and frees (issue #29).

Needs root (``mount``): fails in CI without it, skips elsewhere.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.faults.smalldisk import SmallDisks, missing


def _require() -> None:
    reason = missing()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def _write(path: Path, size: int) -> int | None:
    """Append ``size`` bytes to ``path``; the errno of a failure, or None."""
    try:
        with open(path, "ab") as f:
            f.write(b"x" * size)
    except OSError as exc:
        return exc.errno
    return None


@pytest.mark.timeout(60)
def test_a_disk_fills_to_enospc_and_frees(tmp_path: Path) -> None:
    _require()
    with SmallDisks(tmp_path, [1, 2], size_bytes=8 * 1024 * 1024) as disks:
        assert set(disks.data_dirs()) == {1, 2}
        one, two = disks.data_dir(1) / "f", disks.data_dir(2) / "f"
        assert _write(one, 4096) is None
        disks.fill(1)
        assert disks.is_full(1)
        assert _write(one, 8192) == errno.ENOSPC
        assert _write(two, 8192) is None  # each broker's disk is its own
        disks.free(1)
        assert not disks.is_full(1)
        assert _write(one, 1024 * 1024) is None
        disks.fill(1)  # again, with more in use
        assert _write(one, 8192) == errno.ENOSPC
        mountpoint = disks.mountpoint(1)
    assert not os.path.ismount(mountpoint)


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 1 MiB"):
        SmallDisks(tmp_path, [1], size_bytes=1000)
    disks = SmallDisks(tmp_path, [1])
    with pytest.raises(ValueError, match="no small disk"):
        disks.fill(3)
