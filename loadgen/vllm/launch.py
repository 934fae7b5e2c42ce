"""One vLLM OpenAI-compatible server: config, launch, health wait, stop, and what it says about itself.

vLLM runs as a subprocess of its own interpreter (``venv.resolve_python``) so loadgen never imports
it. The server is started in its own process group with its log captured to a file, and stopped
with SIGTERM then SIGKILL. Its identity (``/version``, served models), engine args and startup-log
facts become the run manifest's additions (``vllm_manifest_extra``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx

from loadgen.util.childproc import ChildProcess
from loadgen.util.errors import EngineError
from loadgen.util.pinning import VLLM_BIND_ENV, engine_cpus, format_cpus
from loadgen.vllm.kv_default import KvDefault, host_kv_cache_gib
from loadgen.vllm.log import behavior_relevant, parse_vllm_log
from loadgen.vllm.result import VllmEngineNotes
from loadgen.vllm.venv import resolve_python

__all__ = ["VllmConfig", "VllmServer", "amx_host", "free_port", "vllm_manifest_extra"]

#: A ``sitecustomize`` put first on the server's ``PYTHONPATH`` (see the module there: AMX tile permission).
VLLM_SITE_DIR = Path(__file__).resolve().parent / "site"

#: Environment variables of the server worth recording in the manifest.
_MANIFEST_ENV_KEYS = ("VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE", "VLLM_CPU_OMP_THREADS_BIND")


def gpu_host(nvidia_device: Path = Path("/dev/nvidia0")) -> bool:
    """Whether a launched vLLM runs on an NVIDIA device (its KV size is then vLLM's --gpu-memory-utilization)."""
    return nvidia_device.exists()


def amx_host(cpuinfo: Path = Path("/proc/cpuinfo"), nvidia_device: Path = Path("/dev/nvidia0")) -> bool:
    """Whether a launched vLLM needs ``VLLM_SITE_DIR``: a CPU with AMX tiles and no NVIDIA device (a CUDA vLLM
    does not run the CPU attention kernel that faults)."""
    if nvidia_device.exists():
        return False
    try:
        return " amx_tile" in cpuinfo.read_text(errors="replace")
    except OSError:
        return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VllmConfig:
    """How to launch one vLLM OpenAI-compatible server."""

    model_dir: Path
    python: Path | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    served_model_name: str | None = None
    dtype: str = "bfloat16"
    kv_cache_gib: int | None = None  # CPU: VLLM_CPU_KVCACHE_SPACE (whole GiB)
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    gpu_memory_utilization: float | None = None
    load_format: str = "dummy"
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    cpus: frozenset[int] | None = None  # pin the server's process tree (None: ``--engine-cpus``, if given)

    def args(self, port: int) -> list[str]:
        """The api_server command-line arguments for this config on ``port``."""
        a = [
            "--model",
            str(self.model_dir),
            "--host",
            self.host,
            "--port",
            str(port),
            "--dtype",
            self.dtype,
            "--load-format",
            self.load_format,
        ]
        for flag, value in (
            ("--served-model-name", self.served_model_name),
            ("--max-model-len", self.max_model_len),
            ("--max-num-seqs", self.max_num_seqs),
            ("--max-num-batched-tokens", self.max_num_batched_tokens),
            ("--block-size", self.block_size),
            ("--gpu-memory-utilization", self.gpu_memory_utilization),
        ):
            if value is not None:
                a += [flag, str(value)]
        return a + list(self.extra_args)


class VllmServer:
    """One vLLM server process group: ``start`` → ``wait_healthy`` → use ``base_url`` → ``stop``."""

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self.python = resolve_python(config.python)
        self.port = config.port or free_port()
        self.log_path = Path(config.log_path) if config.log_path else Path(f"/tmp/loadgen-vllm-{self.port}.log")
        self.child: ChildProcess | None = None
        self.ready_s: float | None = None
        self.cpus = config.cpus if config.cpus is not None else engine_cpus()
        self.kv_default: KvDefault | None = None  # the KV size given by default (``kv_default``), if one was

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.child.proc if self.child is not None else None

    @property
    def started_monotonic(self) -> float | None:
        return self.child.started_monotonic if self.child is not None else None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def command(self) -> list[str]:
        return [str(self.python), "-m", "vllm.entrypoints.openai.api_server", *self.config.args(self.port)]

    def environment(self) -> dict[str, str]:
        """The server's environment: ours, offline and no usage stats by default, then the config's, with
        ``VLLM_SITE_DIR`` first on its ``PYTHONPATH``."""
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        if self.config.kv_cache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(int(self.config.kv_cache_gib))
        elif "VLLM_CPU_KVCACHE_SPACE" not in env and "VLLM_CPU_KVCACHE_SPACE" not in self.config.env and not gpu_host():
            if self.kv_default is None:  # sized once per server, from the memory available when it first starts
                c = self.config
                self.kv_default = host_kv_cache_gib(c.model_dir, c.max_model_len, c.max_num_seqs, c.extra_args)
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_default.kv_cache_gib)
        if self.cpus:  # OpenMP threads bind inside the engine's set, not where vLLM's auto-binding puts them
            env[VLLM_BIND_ENV] = format_cpus(self.cpus)
        env.update(self.config.env)
        if amx_host():  # every vLLM-CPU process asks Linux for the AMX tile state first (its kernel does not: SIGILL)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(VLLM_SITE_DIR), env.get("PYTHONPATH")]))
        return env

    def start(self) -> Self:
        """Launch the server in its own process group (``loadgen.util.childproc``), its output going to ``log_path``."""
        if self.child is not None:
            raise EngineError(f"vLLM on port {self.port}: already started")
        self.child = ChildProcess(
            self.command,
            log_path=self.log_path,
            what="vLLM",
            env=self.environment(),
            cwd="/",
            error=EngineError,
            cpus=self.cpus,
        ).start()
        return self

    def log_text(self) -> str:
        return self.child.log_text() if self.child is not None else ""

    def wait_healthy(self, timeout_s: float = 600.0) -> float:
        """Poll ``/health`` until 200; return seconds since start. EngineError if the process dies or times out."""
        assert self.child is not None and self.child.started_monotonic is not None
        started = self.child.started_monotonic
        with httpx.Client(timeout=5.0) as client:

            def healthy() -> float | None:
                try:
                    ok = client.get(self.base_url + "/health").status_code == 200
                except httpx.HTTPError:
                    return None
                return time.monotonic() - started if ok else None

            self.ready_s = self.child.wait_ready(healthy, timeout_s, poll_s=1.0)
        return self.ready_s

    def exit_line(self) -> str | None:
        """None while the server runs; else what ended it in one line (``ChildProcess.exit_line``)."""
        return self.child.exit_line() if self.child is not None else None

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the process group, wait ``grace_s``, then SIGKILL it. Returns the exit code."""
        return self.child.stop(grace_s) if self.child is not None else None

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def identity(self) -> dict[str, Any]:
        """``/version`` body and served model ids."""
        out: dict[str, Any] = {"version": None, "models": []}
        with httpx.Client(timeout=10.0) as client:
            try:
                out["version"] = client.get(self.base_url + "/version").json().get("version")
            except (httpx.HTTPError, ValueError, AttributeError):
                pass
            try:
                out["models"] = [m["id"] for m in client.get(self.base_url + "/v1/models").json().get("data", [])]
            except (httpx.HTTPError, ValueError, KeyError, AttributeError):
                pass
        return out

    def engine_notes(self) -> dict[str, Any]:
        """Facts from the startup log, plus launcher timings (``VllmEngineNotes``)."""
        notes = parse_vllm_log(self.log_text())
        if self.ready_s is not None:
            notes["ready_s"] = round(self.ready_s, 3)
        return VllmEngineNotes.model_validate(notes).document()

    def manifest_extra(self, memory: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a run's manifest should add for this server (``RunOptions.extra_manifest``)."""
        ident = self.identity()
        return vllm_manifest_extra(self, ident, memory)


def vllm_manifest_extra(
    server: VllmServer, ident: dict[str, Any], memory: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The manifest's ``target`` (kind, version, engine args/env), ``engine_notes`` and ``behavior_relevant``."""
    env = server.environment()
    notes = server.engine_notes()
    return {
        "target": {
            "kind": "vllm",
            "version": {"version": ident.get("version")},
            "engine": {
                "name": "vllm",
                "version": ident.get("version") or notes.get("version"),
                "config": {
                    "args": server.config.args(server.port),
                    "env": {k: env[k] for k in _MANIFEST_ENV_KEYS if k in env},
                    "non_default_args": notes.get("non_default_args"),
                    "model_dir": str(server.config.model_dir),
                    "python": str(server.python),
                    "log_path": str(server.log_path),
                    "cpu_affinity": format_cpus(server.cpus) if server.cpus else None,
                    "kv_cache_default": server.kv_default.rule if server.kv_default is not None else None,
                },
            },
        },
        # the log's notes under "log" (VllmEngineNotes); memory beside them, where measure_with_server puts it
        "engine_notes": {"log": notes, **({"memory": memory} if memory else {})},
        "behavior_relevant": behavior_relevant(notes),
    }
