"""A small disk to fill: a tmpfs of a few MB (root only; a test skips with the reason elsewhere)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

BALLAST = "ballast"


@contextlib.contextmanager
def mounted_small_disk(where: Path, size: str = "2m") -> Iterator[Path]:
    """A tmpfs of ``size`` at ``where`` (made), unmounted at the end; ``pytest.skip`` where it cannot be mounted."""
    where.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or 'not root'})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def free_bytes(where: Path) -> int:
    vfs = os.statvfs(where)
    return vfs.f_bavail * vfs.f_frsize


def leave_free(where: Path, free: int) -> None:
    """Fill the disk at ``where`` with a ballast file until about ``free`` bytes are left."""
    with open(where / BALLAST, "ab") as f:
        f.write(b"\0" * max(0, free_bytes(where) - free))


def free_space(where: Path) -> None:
    """Remove the ballast: the disk is no longer full."""
    (where / BALLAST).unlink(missing_ok=True)
