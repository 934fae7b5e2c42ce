"""How loadgen launches a process it owns (a simulated engine, vLLM): the one definition.

A :class:`ChildProcess` runs in its own process group with stdout and stderr in a log file (a file, not
a pipe: a chatty server never blocks on it). ``wait_ready`` polls the log (or any probe) until the
child says it is ready or dies; ``stop`` sends SIGTERM to the whole group, waits, then SIGKILLs what
is left (engine cores, workers), so nothing outlives the launcher's ``stop``.

When the launcher itself ends without calling ``stop`` (SIGKILL, a crash): on Linux the child is
started through a tiny exec wrapper that sets a parent-death signal (``prctl(PR_SET_PDEATHSIG,
SIGTERM)``) and then execs the real program, so the kernel sends the child SIGTERM the moment its
parent dies, and the child shuts down its own workers. The wrapper runs in the new process, not
between fork and exec (no ``preexec_fn``: that is unsafe with threads), and exits at once when the
parent already died before it ran. The kernel ties the parent-death signal to the *thread* that
forked: children are launched from the main thread (which lives as long as the process); a child
launched from another thread gets no parent-death signal (it would die with that thread).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from loadgen.util.errors import LoadgenError, TargetError
from loadgen.util.pinning import pin

__all__ = ["ChildProcess", "kernel_oom_kills", "oom_kill_record", "with_parent_death_signal"]

T = TypeVar("T")

#: argv: PARENT_PID CPUS PROGRAM ARGS...; sets PR_SET_PDEATHSIG (1) to SIGTERM, pins itself to CPUS
#: (comma-separated ids, ``-`` for no pinning) so that everything PROGRAM starts inherits them, then execs.
_PDEATHSIG_EXEC = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(0)  # the launcher died before the signal was armed\n"
    "if sys.argv[2] != '-':\n"
    "    os.sched_setaffinity(0, {int(c) for c in sys.argv[2].split(',')})\n"
    "try:\n"
    "    os.execvp(sys.argv[3], sys.argv[3:])\n"
    "except OSError as exc:\n"
    "    sys.stderr.write(f'cannot exec {sys.argv[3]}: {exc}\\n')\n"
    "    os._exit(127)\n"
)


def with_parent_death_signal(argv: Sequence[str], cpus: frozenset[int] | None = None) -> list[str]:
    """``argv`` wrapped so the process gets SIGTERM when this process dies (Linux, main thread), and runs
    on ``cpus`` from its first instruction; unchanged elsewhere (see the module docstring)."""
    if sys.platform != "linux" or not sys.executable or threading.current_thread() is not threading.main_thread():
        return list(argv)
    pinned = ",".join(str(c) for c in sorted(cpus)) if cpus else "-"
    return [sys.executable, "-S", "-c", _PDEATHSIG_EXEC, str(os.getpid()), pinned, *argv]


class ChildProcess:
    """One launched process group: ``start`` → ``wait_ready`` → use → ``stop`` (idempotent)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        what: str,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        error: type[LoadgenError] = TargetError,
        cpus: frozenset[int] | None = None,
    ) -> None:
        self.error = error  # raised when it cannot start or does not become ready
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.what = what  # for messages: "sim server (engine instant)", "vLLM"
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.cpus = cpus  # the CPUs the whole process tree runs on (None: inherited from this process)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_monotonic: float | None = None

    def start(self) -> ChildProcess:
        if self.alive():
            raise self.error(f"{self.what}: already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.started_monotonic = time.monotonic()
        program = self.argv[0]
        if os.sep in program:
            found = os.access(os.path.join(str(self.cwd or "."), program), os.X_OK)
        else:
            found = shutil.which(program, path=(self.env or os.environ).get("PATH")) is not None
        if not found:  # checked here: the exec wrapper could only report it in the log
            raise self.error(f"{self.what}: cannot start {program} (not found or not executable)")
        argv = with_parent_death_signal(self.argv, self.cpus)
        try:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                )
        except OSError as exc:
            raise self.error(f"{self.what}: cannot start {self.argv[0]} ({exc.strerror})") from None
        if self.cpus and argv == self.argv:  # no wrapper pinned it from its start: as early as we can
            try:
                pin(self.proc.pid, self.cpus)
            except (OSError, LoadgenError):
                pass
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 3) -> str:
        lines = [ln.strip()[:200] for ln in self.log_text().splitlines() if ln.strip()]
        return " | ".join(lines[-n:])

    def exit_line(self) -> str | None:
        """None while it runs; else what ended it, in one line: its exit status or signal, an OOM kill the
        kernel logged since it started (where the kernel log is readable), its last log line and the log's path."""
        code = self.returncode
        if self.proc is None or code is None:
            return None
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = "unknown"
            how = f"was killed by signal {-code} ({name})"
        else:
            how = f"exited with status {code}"
        kills = kernel_oom_kills(self.started_monotonic)
        if kills is None:
            oom = "; the kernel log is not readable here, so an OOM kill cannot be confirmed" if code else ""
        elif kills:
            oom = f"; the kernel's OOM killer: {kills[-1]}" + (
                f" (and {len(kills) - 1} more)" if len(kills) > 1 else ""
            )
        else:
            oom = ""
        last = self.log_tail(1) or "(empty)"
        return f"{self.what} (pid {self.proc.pid}) {how}{oom}; last log line: {last} (log {self.log_path})"

    def wait_ready(self, probe: Callable[[], T | None], timeout_s: float, poll_s: float = 0.05) -> T:
        """Call ``probe`` until it returns a value; ``error`` (and stop) if the child dies or time runs out.

        Any other ending while waiting (Ctrl-C, SIGTERM, a bug) stops the child too before it propagates.
        """
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                value = probe()
                if value is not None:
                    return value
                if self.proc is None or self.proc.poll() is not None:
                    raise self.error(f"at start: {self.exit_line() or self.what + ': not started'}")
                time.sleep(poll_s)
        except BaseException:
            self.stop()
            raise
        self.stop()
        raise self.error(f"{self.what} not ready within {timeout_s:g} s (log {self.log_path}): {self.log_tail()}")

    def stop(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM the process group, wait ``grace_s``, SIGKILL what is left; returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(proc.pid, signal.SIGKILL)  # stragglers in the group (engine cores, workers)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        return proc.returncode


#: A kernel log record of an OOM kill: "Out of memory: Killed process 123 (python3) total-vm:...".
_OOM_KILL = re.compile(r"Killed process (\d+) \(([^)]*)\)[^\n]*")


def oom_kill_record(record: str) -> tuple[float | None, str | None]:
    """``(seconds since boot, "Killed process PID (NAME) ...")`` of one ``/dev/kmsg`` record
    (``PRI,SEQ,USEC,FLAGS;MESSAGE``); the line is None when the record is not an OOM kill."""
    head, _, message = record.partition(";")
    fields = head.split(",")
    stamp_s = int(fields[2]) / 1e6 if len(fields) > 2 and fields[2].isdigit() else None
    found = _OOM_KILL.search(message)
    return stamp_s, found.group(0).strip()[:200] if found else None


def kernel_oom_kills(since_monotonic_s: float | None = None) -> list[str] | None:
    """The kernel's OOM-kill lines (``Killed process PID (NAME) ...``) logged since ``since_monotonic_s``
    (CLOCK_MONOTONIC seconds; the kernel stamps records with a clock close to it); None when ``/dev/kmsg``
    cannot be read."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    kills: list[str] = []
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break
            except OSError:  # EPIPE: records overwritten while reading; go on from the next
                continue
            stamp_s, kill = oom_kill_record(record)
            if kill and (since_monotonic_s is None or stamp_s is None or stamp_s >= since_monotonic_s - 1.0):
                kills.append(kill)
    finally:
        os.close(fd)
    return kills


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
