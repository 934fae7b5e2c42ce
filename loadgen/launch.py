"""Launching the simulated engine as a real server process on loopback, for bench, practice and plans.

``SimServer`` starts ``python -m loadgen sim serve`` in its own process group, waits for its ready
line (``loadgen-sim listening on URL``), and stops it with SIGTERM (SIGKILL after a grace period).
Restarting it gives a cold engine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .errors import TargetError

__all__ = ["SimServer", "READY_PREFIX"]

READY_PREFIX = "loadgen-sim listening on "


class SimServer:
    """A simulated engine server process; use as a context manager."""

    def __init__(
        self,
        engine: str = "interactive-small-batch",
        *extra_args: str,
        host: str = "127.0.0.1",
        port: int = 0,
        log_path: Path | None = None,
        startup_timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.engine = engine
        self.extra_args = list(extra_args)
        self.host = host
        self.port = port
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.env = env
        self.process: subprocess.Popen[str] | None = None
        self.base_url: str | None = None
        self._log_lines: list[str] = []
        self.starts = 0

    def start(self) -> str:
        """Start the server; return its base URL once it is listening."""
        cmd = [sys.executable, "-m", "loadgen", "sim", "serve", "--engine", self.engine, "--host", self.host,
               "--port", str(self.port), *self.extra_args]
        env = dict(os.environ, **(self.env or {}))
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        self.starts += 1
        deadline = time.monotonic() + self.startup_timeout_s
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                if self.process.poll() is not None:
                    tail = "".join(self._log_lines[-5:]).strip().replace("\n", " | ")
                    raise TargetError(f"simulated engine {self.engine!r} exited with code {self.process.returncode} before listening: {tail}")
                continue
            self._log_lines.append(line)
            if line.startswith(READY_PREFIX):
                self.base_url = line[len(READY_PREFIX):].strip()
                threading.Thread(target=self._drain, daemon=True).start()
                return self.base_url
        self.stop()
        raise TargetError(f"simulated engine {self.engine!r} did not listen within {self.startup_timeout_s:g} s")

    def _drain(self) -> None:
        proc = self.process
        if proc is None or proc.stdout is None:
            return
        sink = open(self.log_path, "a") if self.log_path else None
        try:
            for line in proc.stdout:
                if sink:
                    sink.write(line)
                    sink.flush()
        except (OSError, ValueError):
            pass
        finally:
            if sink:
                sink.close()

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL after ``grace_s``; idempotent."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace_s)
        except ProcessLookupError:
            pass

    def restart(self) -> str:
        """Stop and start again: a cold engine (empty caches, fresh queues)."""
        self.stop()
        return self.start()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> "SimServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
