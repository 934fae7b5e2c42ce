"""Launch the simulated engine's live server as a real subprocess on loopback (a test helper).

    with start_sim_server("instant") as sim:
        httpx.post(sim.base_url + "/v1/completions", json={...})

The server runs ``python -m loadgen sim serve --port 0``; the helper waits for its ready line,
and stops it (SIGTERM, then SIGKILL) on exit. ``fault_log_path`` is the JSONL fault log.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
READY_PREFIX = "loadgen-sim listening on "

__all__ = ["SimServerHandle", "start_sim_server", "REPO"]


@dataclass
class SimServerHandle:
    base_url: str
    process: subprocess.Popen
    fault_log_path: Path

    def fault_lines(self) -> list[dict]:
        """The fault log's entries so far."""
        import json

        if not self.fault_log_path.exists():
            return []
        return [json.loads(line) for line in self.fault_log_path.read_text().splitlines() if line.strip()]


@contextmanager
def start_sim_server(
    engine: str = "interactive-small-batch",
    *extra_args: str,
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 30.0,
) -> Iterator[SimServerHandle]:
    """Start ``loadgen sim serve --engine ENGINE --port 0 [extra_args]``; yield its handle."""
    tmp = Path(tempfile.mkdtemp(prefix="loadgen-sim-"))
    fault_log = tmp / "faults.jsonl"
    args = list(extra_args)
    if "--fault-log" in args:
        fault_log = Path(args[args.index("--fault-log") + 1])
    else:
        args += ["--fault-log", str(fault_log)]
    cmd = [sys.executable, "-m", "loadgen", "sim", "serve", "--engine", str(engine), "--host", "127.0.0.1", "--port", "0", *args]
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    stderr_path = tmp / "stderr.log"
    with open(stderr_path, "w") as stderr:  # a file, not a pipe: a chatty server must never block on it
        proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        base_url = _wait_ready(proc, ready_timeout_s, stderr_path)
        yield SimServerHandle(base_url=base_url, process=proc, fault_log_path=fault_log)
    finally:
        _stop(proc)


def _wait_ready(proc: subprocess.Popen, timeout_s: float, stderr_path: Path) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not sel.select(timeout=0.1):
            if proc.poll() is not None:
                break
            continue
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(READY_PREFIX):
            return line[len(READY_PREFIX):].strip()
    _stop(proc)
    err = stderr_path.read_text() if stderr_path.exists() else ""
    raise RuntimeError(f"simulated server did not become ready (rc={proc.returncode}): {err[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()
