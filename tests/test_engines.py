"""Engine plumbing without vLLM: model dirs, log parsing, process-group lifecycle, memory sampling.

The lifecycle tests launch a real subprocess through VllmServer with a stand-in ``vllm`` package on
PYTHONPATH (an HTTP server answering /health, /version and /v1/models, with a child process), so start,
health wait, log capture, SIGTERM→SIGKILL escalation and process-group cleanup are exercised for real.
The same code against real vLLM runs in test_vllm_integration.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError
from result_schemas import assert_valid, schema_errors

from loadgen.util.childproc import kernel_oom_kills, oom_kill_record
from loadgen.util.errors import EngineError
from loadgen.vllm import (
    MemorySampler,
    VllmConfig,
    VllmServer,
    make_model_dir,
    parse_vllm_log,
    shipped_model_path,
    shipped_models,
)
from loadgen.vllm.kv_default import host_kv_cache_gib
from loadgen.vllm.launch import VLLM_SITE_DIR, amx_host, gpu_host
from loadgen.vllm.result import VllmLogNotes, ready_document

ROOT = Path(__file__).resolve().parents[1]
LLAMA_JSON = str(ROOT / "loadgen" / "data" / "models" / "llama-3.1-8b.json")

CPU_LOG = """\
(APIServer pid=5948) INFO 11-29 08:15:16 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0
(APIServer pid=5948) INFO 11-29 08:15:16 [api_utils.py:286] non-default args: {'port': 8123, 'model': '/tmp/m', 'dtype': 'bfloat16', 'max_model_len': 2000, 'load_format': 'dummy'}
(APIServer pid=5948) INFO 11-29 08:15:26 [model.py:733] Resolved architecture: LlamaForCausalLM
(EngineCore pid=6243) INFO 11-29 08:15:33 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/tmp/m', speculative_config=None, dtype=torch.bfloat16, max_seq_len=2000, load_format=dummy, tensor_parallel_size=1, quantization=None, kv_cache_dtype=auto, device_config=cpu, enable_prefix_caching=True, enable_chunked_prefill=True, compilation_config={'mode': 2}
(APIServer pid=5948) INFO 11-29 08:15:26 [model.py:2152] Using max model len 2000
(Worker pid=6294) INFO 11-29 08:15:42 [base_loader.py:82] Initializing model took 0.160507 seconds
(Worker pid=6294) INFO 11-29 08:15:43 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=6294) INFO 11-29 08:16:14 [monitor.py:91] [backbone] Initial profiling/warmup run took 0.14 s
(Worker pid=6294) INFO 11-29 08:16:14 [cpu_model_runner.py:91] Warming up done.
(Worker pid=6294) INFO 11-29 08:16:14 [cpu_worker.py:260] Explicitly set (1.0/8.71) GiB for KV cache on node 0.
(EngineCore pid=6243) INFO 11-29 08:16:14 [kv_cache_utils.py:2327] CPU KV cache size: 512,000 tokens, Maximum concurrency for 2,000 tokens per request: 256.00x
(EngineCore pid=6243) INFO 11-29 08:16:17 [core.py:402] init engine (profile, create kv cache, warmup model) took 34.06 s
(APIServer pid=5948) INFO 11-29 08:16:17 [entry.py:140] Starting vLLM server on http://0.0.0.0:8123
"""

GPU_LOG = """\
INFO 05-01 10:00:00 [core.py:133] Initializing a V1 LLM engine (v0.9.1) with config: model='/m'
INFO 05-01 10:00:20 [default_loader.py:272] Loading weights took 3.21 seconds
INFO 05-01 10:00:21 [gpu_model_runner.py:1801] Model loading took 14.9889 GiB and 4.101 seconds
INFO 05-01 10:00:40 [backends.py:508] Dynamo bytecode transform time: 6.52 s
INFO 05-01 10:01:00 [monitor.py:34] torch.compile takes 21.36 s in total
INFO 05-01 10:01:02 [gpu_worker.py:232] Available KV cache memory: 54.48 GiB
INFO 05-01 10:01:02 [kv_cache_utils.py:716] GPU KV cache size: 446,288 tokens
INFO 05-01 10:01:02 [kv_cache_utils.py:720] Maximum concurrency for 8,192 tokens per request: 54.48x
INFO 05-01 10:01:30 [gpu_model_runner.py:2326] Graph capturing finished in 28 secs, took 0.53 GiB
INFO 05-01 10:01:30 [core.py:172] init engine (profile, create kv cache, warmup model) took 70.02 s
INFO 05-01 10:00:01 [scheduler.py:222] Chunked prefill is enabled with max_num_batched_tokens=8192.
"""


def test_parse_cpu_log():
    notes = parse_vllm_log(CPU_LOG)
    assert notes["version"] == "0.32.0" and notes["architecture"] == "LlamaForCausalLM"
    assert notes["kv_cache_device"] == "CPU" and notes["kv_cache_size_tokens"] == 512_000
    assert notes["max_concurrency"] == 256.0 and notes["kv_cache_max_model_len"] == 2000
    assert notes["kv_cache_memory_gib"] == 1.0 and notes["init_engine_s"] == 34.06
    assert notes["non_default_args"]["load_format"] == "dummy"
    assert notes["warmup_s"] == 31.0 and notes["startup_s_from_log"] == 61.0
    assert notes["engine_config"]["max_seq_len"] == 2000 and notes["engine_config"]["dtype"] == "bfloat16"
    from loadgen.vllm.log import behavior_relevant

    behavior = behavior_relevant(notes)
    assert (
        behavior["prefix_caching"] is True and behavior["quantization"] is None and behavior["kv_cache_dtype"] == "auto"
    )


def test_parsed_logs_conform_to_the_published_schema_and_refuse_unknown_keys():
    """Every key parse_vllm_log writes is one `loadgen schema vllm-log` names; a key it does not name is refused
    by the model (at parse time) and by the schema."""
    for text in (CPU_LOG, GPU_LOG):
        assert_valid("vllm-log", parse_vllm_log(text))
    notes = parse_vllm_log(GPU_LOG) | {"kv_cache_blocks": 27893}
    with pytest.raises(ValidationError, match="kv_cache_blocks"):
        VllmLogNotes.model_validate(notes)
    assert any("kv_cache_blocks" in e for e in schema_errors("vllm-log", notes))
    assert any("ready_s" in e for e in schema_errors("vllm-log", {"ready_s": 1.0}))  # the launcher's, not the log's
    assert schema_errors("vllm-log", {}) != []  # parse-log refuses a log that gives nothing


def test_non_default_args_that_are_no_dict_stay_text():
    """vLLM's 'non-default args' line is a dict literal, kept as JSON holds it; one that spells anything else is
    kept as its text (a set had stopped `parse-log` with a traceback: not JSON serializable)."""
    line = "INFO 11-29 08:15:16 [api_utils.py:286] non-default args: {'port', 8123}\n"
    assert parse_vllm_log(line) == {"non_default_args": "{'port', 8123}"}
    assert_valid("vllm-log", parse_vllm_log(line))
    nested = line.replace("{'port', 8123}", "{'port': 8123, 'sizes': (1, 2), 'skip': {'a'}}")
    assert parse_vllm_log(nested) == {"non_default_args": {"port": 8123, "sizes": [1, 2], "skip": "{'a'}"}}


# a damaged or forged vLLM log: one line naming the file, the key and the value, exit 2, nothing printed
DAMAGED_LOG_NUMBERS = [
    ("512,000 tokens", "9" * 400 + " tokens", "kv_cache_size_tokens = '99"),  # had been an OverflowError traceback
    ("512,000 tokens", "1" + "0" * 300 + " tokens", "kv_cache_size_tokens = '10"),  # had been printed as tokens
    ("512,000 tokens", "0 tokens", "kv_cache_size_tokens = 0: expected a number in [1, 1e+12]"),
    ("max model len 2000", "max model len " + "9" * 30, "max_model_len = 99"),
    ("256.00x", "9" * 400 + "x", "max_concurrency = inf: expected a finite number"),
    ("(1.0/8.71) GiB", "(1" + "0" * 300 + "/8.71) GiB", "kv_cache_memory_gib = 1e+300: expected a number in [0, "),
    ("took 34.06 s", "took 1" + "0" * 20 + " s", "init_engine_s = 1e+20: expected a number in [0, "),
]


@pytest.mark.parametrize(("line", "damaged", "expected"), DAMAGED_LOG_NUMBERS, ids=lambda v: str(v)[:12])
def test_parse_log_refuses_a_number_out_of_range(tmp_path, line, damaged, expected):
    from cli_process import run_loadgen

    log = tmp_path / "vllm.log"
    log.write_text(CPU_LOG.replace(line, damaged, 1))
    r = run_loadgen(["vllm", "parse-log", log], ROOT)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr[-500:]
    assert len(r.stderr.strip().splitlines()) == 1 and f"{log}: {expected}" in r.stderr
    assert len(r.stderr) < 300  # a 400-digit value is cut, not echoed


def test_parse_log_numbers_as_vllm_prints_them(tmp_path):
    """Thousands grouped by commas are read; a malformed grouping ("5,,,") is no number, so its line gives nothing
    (it had been read as 5 tokens); a span that runs backwards by the year-less timestamps (a log over New Year)
    is left out (it had been a negative warmup_s)."""
    from cli_process import run_loadgen

    log = tmp_path / "vllm.log"
    log.write_text(
        CPU_LOG.replace("512,000 tokens", "5,,, tokens")
        .replace("11-29 08:15:43 [cpu_model_runner.py:87]", "12-31 23:59:59 [cpu_model_runner.py:87]")
        .replace("11-29 08:16:14 [cpu_model_runner.py:91]", "01-01 00:00:05 [cpu_model_runner.py:91]")
    )
    r = run_loadgen(["vllm", "parse-log", log], ROOT)
    notes = json.loads(r.stdout)
    assert r.returncode == 0 and "kv_cache_size_tokens" not in notes and "warmup_s" not in notes
    assert notes["max_concurrency"] == 256.0 and notes["startup_s_from_log"] == 61.0


@pytest.mark.slow
def test_parse_log_skips_a_line_too_long_to_be_vllms(tmp_path):
    """A line over MAX_LOG_LINE_CHARS is no startup line of vLLM's: skipped, not parsed. A 160 MB 'non-default
    args' dict had taken 24 GB in ast.literal_eval until the kernel killed parse-log; here 2 MiB stands for it."""
    from cli_process import run_loadgen

    from loadgen.vllm.log import MAX_LOG_LINE_CHARS

    huge = "INFO 11-29 08:15:16 [api_utils.py:286] non-default args: {" + "'a': 1, " * (MAX_LOG_LINE_CHARS // 8) + "}"
    override = "WARNING 11-29 08:15:30 [cuda.py:1] block_size=64 overridden: the backend requires it"
    log = tmp_path / "vllm.log"
    log.write_text(huge + "\n" + CPU_LOG.replace("non-default args", "non default args") + override + "\n")
    r = run_loadgen(["vllm", "parse-log", log], ROOT)
    notes = json.loads(r.stdout)
    assert r.returncode == 0 and "non_default_args" not in notes and notes["kv_cache_size_tokens"] == 512_000
    assert notes["block_size_override"] == 64 and notes["startup_s_from_log"] == 61.0
    assert "block_size_override" not in parse_vllm_log("INFO x block_size=64 is what was asked for\n")


def test_the_ready_line_conforms_to_the_published_schema():
    """`loadgen vllm serve`'s ready line, built by ready_document from a server's identity and notes."""
    notes = parse_vllm_log(CPU_LOG) | {"ready_s": 61.234}
    line = ready_document("http://127.0.0.1:8123", 61.234, "/tmp/v.log", {"version": "0.32.0", "models": ["m"]}, notes)
    assert_valid("vllm-serve", line)
    assert list(line) == ["base_url", "ready_s", "log", "version", "models", "engine_notes"]
    assert line["ready_s"] == 61.2 and line["engine_notes"] == notes
    silent = ready_document("http://h:1", 2.0, "/tmp/v.log", {"version": None, "models": []}, {})
    assert_valid("vllm-serve", silent)  # /version unanswered and a log that gives nothing yet
    with pytest.raises(ValidationError, match="oom"):
        ready_document("http://h:1", 2.0, "/tmp/v.log", {}, {"oom": True})


def test_parse_gpu_log_other_formats():
    notes = parse_vllm_log(GPU_LOG)
    assert notes["version"] == "0.9.1"
    assert notes["weights_loading_s"] == 3.21 and notes["weights_memory_gib"] == 14.9889
    assert (
        notes["kv_cache_memory_gib"] == 54.48 and notes["graph_memory_gib"] == 0.53 and notes["graph_capture_s"] == 28
    )
    assert notes["torch_compile_s"] == 21.36 and notes["dynamo_transform_s"] == 6.52
    assert notes["max_num_batched_tokens"] == 8192
    # older vLLM prints size and concurrency on two lines
    assert notes["kv_cache_size_tokens"] == 446_288 and notes["max_concurrency"] == 54.48
    assert parse_vllm_log("nothing useful here\n") == {}


def test_make_model_dir_tokenizer_round_trip(tmp_path):
    from tokenizers import Tokenizer

    from loadgen.ledger import read_model_config
    from loadgen.workload.prompts import get_tokenizer

    out = make_model_dir("tiny-qwen2", tmp_path / "m")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["bos_token_id"] == 0 and cfg["eos_token_id"] == 1
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.token_to_id("<s>") == 0 and tok.token_to_id("</s>") == 1
    assert 300 <= tok.get_vocab_size() <= cfg["vocab_size"]
    text = "the model streams tokens to the server 42."
    assert tok.decode(tok.encode(text).ids) == text
    assert json.loads((out / "tokenizer_config.json").read_text())["eos_token"] == "</s>"
    assert read_model_config(out).num_kv_heads == 2
    counter = get_tokenizer(f"hf:{out / 'tokenizer.json'}")
    assert counter is not None
    long = text * 200  # counted by encode_batch (which lets go of the GIL in a worker thread): the same count
    assert counter.count(long) == len(tok.encode(long, add_special_tokens=False).ids)
    again = make_model_dir("tiny-qwen2", tmp_path / "m2")
    assert (again / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()  # deterministic


def test_shipped_models_parse():
    from loadgen.ledger import read_model_config

    names = shipped_models()
    assert {
        "tiny-llama-gqa",
        "tiny-qwen2",
        "llama-3.1-8b",
        "qwen2.5-7b",
        "mistral-7b",
        "qwen2.5-0.5b",
        "deepseek-v2-lite",
    } <= set(names)
    for name in names:
        read_model_config(ROOT / "loadgen" / "data" / "models" / f"{name}.json")


def test_make_model_dir_errors(tmp_path):
    with pytest.raises(EngineError, match="not shipped"):
        make_model_dir("no-such-model", tmp_path / "x")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"vocab_size": 10}))
    with pytest.raises(EngineError, match="vocab_size = 10"):
        make_model_dir(bad, tmp_path / "y")


STANDIN = """
import json, os, signal, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
if os.environ.get("STANDIN_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(os.environ["STANDIN_CHILD_FILE"], "w").write(str(child.pid))
print("INFO 11-29 08:15:26 [model.py:2152] Using max model len 1000", flush=True)
time.sleep(float(os.environ.get("STANDIN_DELAY", "0.5")))
if os.environ.get("STANDIN_CRASH"):
    print("RuntimeError: standin crashed on purpose", flush=True)
    sys.exit(3)
print("INFO 11-29 08:15:30 [kv_cache_utils.py:2327] CPU KV cache size: 4,096 tokens, Maximum concurrency for 1,000 tokens per request: 4.10x", flush=True)
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        body = {"/health": {}, "/version": {"version": "0.0-standin"}, "/v1/models": {"data": [{"id": "standin"}]}}.get(self.path)
        self.send_response(200 if body is not None else 404); self.end_headers()
        self.wfile.write(json.dumps(body or {}).encode())
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.fixture()
def standin(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (pkg.parent.parent, pkg.parent, pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(textwrap.dedent(STANDIN))
    child_file = tmp_path / "child.pid"
    env = {"PYTHONPATH": str(tmp_path / "site"), "STANDIN_CHILD_FILE": str(child_file)}
    return env, child_file


def _server(tmp_path, env, **kw) -> VllmServer:
    cfg = VllmConfig(
        model_dir=tmp_path,
        python=Path(sys.executable),
        kv_cache_gib=kw.pop("kv_cache_gib", 1),
        max_model_len=1000,
        env=env,
        log_path=tmp_path / "server.log",
        **kw,
    )
    return VllmServer(cfg)


def test_server_lifecycle(tmp_path, standin):
    env, child_file = standin
    server = _server(tmp_path, env)
    with server:
        assert server.ready_s is not None and server.ready_s > 0
        assert server.identity() == {"version": "0.0-standin", "models": ["standin"]}
        assert server.environment()["VLLM_CPU_KVCACHE_SPACE"] == "1"
        notes = server.engine_notes()
        assert notes["kv_cache_size_tokens"] == 4096 and notes["max_model_len"] == 1000
        extra = server.manifest_extra()
        assert extra["target"]["kind"] == "vllm" and extra["target"]["engine"]["version"] == "0.0-standin"
        log_notes = dict(extra["engine_notes"]["log"])  # the manifest's vLLM notes: parse-log's, and ready_s
        assert log_notes.pop("ready_s") > 0 and log_notes == parse_vllm_log(server.log_text())
        assert_valid("vllm-log", log_notes)
        memory = server.manifest_extra({"rss_high_water_bytes": 1})["engine_notes"]
        assert memory["memory"] == {"rss_high_water_bytes": 1} and "memory" not in memory["log"]  # beside, as amended
        assert "--load-format" in extra["target"]["engine"]["config"]["args"]
        child = int(child_file.read_text())
        assert psutil.pid_exists(child)
        sampler = MemorySampler(server.proc.pid, interval_s=0.05).start()
        time.sleep(0.3)
        summary = sampler.stop()
        assert summary["samples"] >= 2 and summary["rss_high_water_bytes"] > 5 << 20
        assert sampler.summary(ledger_total_bytes=1 << 30)["rss_high_water_over_ledger"] > 0
        if Path("/proc/self/status").exists():  # Linux: RSS split by kind, and the kernel's per-process peaks
            assert 0 < summary["held_high_water_bytes"] <= summary["rss_high_water_bytes"]
            assert (
                summary["held_high_water_bytes"] + summary["file_backed_high_water_bytes"]
                >= summary["rss_high_water_bytes"]
            )
            assert summary["hwm_sum_bytes"] >= summary["rss_high_water_bytes"]
    assert server.proc.poll() is not None
    time.sleep(0.2)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE  # group killed
    assert "KV cache size" in server.log_path.read_text()


def test_server_sigkill_after_grace(tmp_path, standin):
    env, child_file = standin
    server = _server(tmp_path, {**env, "STANDIN_IGNORE_TERM": "1"})
    server.start()
    server.wait_healthy(30)
    t0 = time.monotonic()
    rc = server.stop(grace_s=1.0)
    assert rc == -9 and 0.9 <= time.monotonic() - t0 < 15


def test_server_crash_reports_log_tail(tmp_path, standin):
    env, _ = standin
    server = _server(tmp_path, {**env, "STANDIN_CRASH": "1"})
    server.start()
    with pytest.raises(
        EngineError, match="exited with status 3; last log line: RuntimeError: standin crashed on purpose"
    ):
        server.wait_healthy(30)
    server.stop()


def test_a_launched_engine_that_dies_is_reported_in_one_line(tmp_path, standin):
    """An engine killed mid-run (the kernel's OOM killer sends SIGKILL) is reported as what happened to it:
    the signal, an OOM kill where the kernel log shows one, its last log line and the log's path."""
    env, _ = standin
    server = _server(tmp_path, env)
    server.start()
    server.wait_healthy(30)
    assert server.exit_line() is None
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    line = server.exit_line()
    assert line is not None and "\n" not in line
    assert f"(pid {server.proc.pid}) was killed by signal 9 (SIGKILL)" in line
    assert "last log line: " in line and f"(log {server.log_path})" in line
    server.stop()


def test_kernel_oom_kill_lines_are_read_from_the_kernel_log():
    kills = kernel_oom_kills(time.monotonic() + 3600)  # none logged in the future
    assert kills is None or kills == []
    # a record as the kernel writes it (6.x, the OOM killer of the 24 GiB host)
    record = (
        "3,1234,987654321,-;Out of memory: Killed process 4242 (VLLM::Worker) total-vm:30123456kB, "
        "anon-rss:22900000kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:45000kB oom_score_adj:0\n"
    )
    stamp_s, line = oom_kill_record(record)
    assert stamp_s == 987.654321 and line is not None and line.startswith("Killed process 4242 (VLLM::Worker)")
    assert oom_kill_record("6,1,5,-;eth0: link up\n") == (5e-6, None)


@pytest.mark.skipif(gpu_host(), reason="a CUDA vLLM is sized by --gpu-memory-utilization, not by a host KV default")
def test_a_launched_engine_gets_a_kv_size_that_fits_the_host(tmp_path, standin):
    """With no KV size given, a CPU vLLM got none and grew until the OOM killer ended it (issue 34): now it gets
    the host's room after the ledger's other lines and the client's reserve, capped at what its sequences use."""
    env, _ = standin
    shutil.copy(shipped_model_path("tiny-llama-gqa"), tmp_path / "config.json")
    server = _server(tmp_path, env, kv_cache_gib=None, max_num_seqs=8)
    with server:
        assert server.environment()["VLLM_CPU_KVCACHE_SPACE"] == "1"  # 8 x 1000 tokens of the tiny Llama
        assert server.kv_default is not None
        extra = server.manifest_extra()
        config = extra["target"]["engine"]["config"]
        assert config["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
        assert (
            config["kv_cache_default"].startswith("1 GiB by default: ")
            and "for the client" in config["kv_cache_default"]
        )
    assert _server(tmp_path, env, kv_cache_gib=3).environment()["VLLM_CPU_KVCACHE_SPACE"] == "3"  # given: kept
    told = _server(tmp_path, {**env, "VLLM_CPU_KVCACHE_SPACE": "2"}, kv_cache_gib=None)
    assert told.environment()["VLLM_CPU_KVCACHE_SPACE"] == "2" and told.kv_default is None
    # the 8B Llama at 4,096 tokens x 8 sequences on a 24 GiB host: 4 GiB; on 16 GiB nothing fits: one line
    big = shipped_model_path("llama-3.1-8b")
    assert host_kv_cache_gib(big, 4096, 8, [], available=24 << 30).kv_cache_gib == 4
    assert (
        host_kv_cache_gib(
            big, None, None, ["--max-model-len=4096", "--max-num-seqs", "2"], available=24 << 30
        ).kv_cache_gib
        == 1
    )
    with pytest.raises(EngineError, match=r"16.0 GiB available.*less than 1 GiB: expected --kv-cache-gib"):
        host_kv_cache_gib(big, 4096, 8, [], available=16 << 30)


XCOMP_PERM_PROBE = """
import ctypes, json, sys
mask = ctypes.c_uint64(0)
rc = ctypes.CDLL(None, use_errno=True).syscall(158, 0x1022, ctypes.byref(mask))  # ARCH_GET_XCOMP_PERM
print(json.dumps({"site": sys.modules["sitecustomize"].__file__, "theirs": "their_site_ran" in sys.modules,
                  "tiles": rc == 0 and bool(mask.value >> 18 & 1)}))
"""


def test_every_vllm_process_asks_for_the_amx_tile_state(tmp_path):
    """vLLM-CPU 0.32's AMX attention kernel ran tile instructions in worker processes that never asked Linux for
    the tile state: SIGILL at the first forward pass, HTTP 500 for every request (CI, an AMX host). The server's
    environment puts loadgen's ``sitecustomize`` first, which asks in every process (spawned workers too), and
    a ``sitecustomize`` of the config's own PYTHONPATH still runs."""
    import subprocess

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import sys\nsys.modules['their_site_ran'] = sys\n")
    env = _server(tmp_path, {"PYTHONPATH": str(theirs)}).environment()
    if not amx_host():  # no AMX tiles (or a CUDA device): the server's PYTHONPATH is left as configured
        assert env["PYTHONPATH"].split(os.pathsep) == [str(theirs)]
        env["PYTHONPATH"] = os.pathsep.join([str(VLLM_SITE_DIR), str(theirs)])  # the module itself still works
    assert env["PYTHONPATH"].split(os.pathsep) == [str(VLLM_SITE_DIR), str(theirs)]
    probe = subprocess.run(
        [sys.executable, "-c", XCOMP_PERM_PROBE], env=env, capture_output=True, text=True, check=True
    )
    seen = json.loads(probe.stdout)
    assert Path(seen["site"]).parent == VLLM_SITE_DIR and seen["theirs"]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and " amx_tile" in cpuinfo.read_text() and os.uname().machine == "x86_64":
        assert seen["tiles"], "the AMX tile permission was not granted"


def test_the_amx_site_goes_only_to_a_cpu_vllm_on_an_amx_host(tmp_path):
    """The ``sitecustomize`` is for vLLM-CPU's AMX kernel: a host with an NVIDIA device (a CUDA vLLM) or without
    AMX tiles does not get it."""
    amx, plain, nvidia = tmp_path / "amx", tmp_path / "plain", tmp_path / "nvidia0"
    amx.write_text("flags\t\t: fpu sse2 avx512f amx_bf16 amx_tile amx_int8\n")
    plain.write_text("flags\t\t: fpu sse2 avx2\n")
    assert amx_host(amx, tmp_path / "absent") and not amx_host(plain, tmp_path / "absent")
    nvidia.write_text("")
    assert not amx_host(amx, nvidia)
    assert not amx_host(tmp_path / "no-cpuinfo", tmp_path / "absent")


def test_missing_python_is_engine_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LOADGEN_VLLM_PYTHON", str(tmp_path / "nope" / "python"))
    with pytest.raises(EngineError, match="LOADGEN_VLLM_PYTHON"):
        VllmServer(VllmConfig(model_dir=tmp_path))


def test_cli_make_model_and_parse_log(tmp_path):
    import subprocess

    r = subprocess.run(
        [sys.executable, "-m", "loadgen", "vllm", "make-model", "--out", str(tmp_path / "m")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "m" / "config.json").read_text())["num_key_value_heads"] == 4
    log = tmp_path / "vllm.log"
    log.write_text(CPU_LOG)
    r = subprocess.run(
        [sys.executable, "-m", "loadgen", "vllm", "parse-log", str(log)], capture_output=True, text=True, cwd=ROOT
    )
    parsed = json.loads(r.stdout)
    assert parsed["kv_cache_size_tokens"] == 512_000
    assert_valid("vllm-log", parsed)  # `loadgen schema vllm-log`
    assert os.path.exists(tmp_path / "m" / "tokenizer.json")
    # a file with no line vLLM prints is refused, not answered with an empty {} that reads as a parsed log
    log.write_text("garbage\nmore garbage\n")
    r = subprocess.run(
        [sys.executable, "-m", "loadgen", "vllm", "parse-log", str(log)], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 2 and r.stdout == "" and "expected a vLLM server log" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_cli_serve_until_interrupted(tmp_path, standin):
    """`loadgen vllm serve` prints identity once healthy and stops the whole group on Ctrl-C."""
    import signal
    import subprocess

    env_extra, child_file = standin
    env = {**os.environ, **env_extra}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadgen",
            "vllm",
            "serve",
            "--model-dir",
            str(tmp_path),
            "--python",
            sys.executable,
            "--kv-cache-gib",
            "1",
            "--log",
            str(tmp_path / "serve.log"),
            "--",
            "--max-num-seqs",
            "4",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("}"):
            break
    info = json.loads("".join(lines))
    assert info["version"] == "0.0-standin" and info["engine_notes"]["kv_cache_size_tokens"] == 4096
    assert_valid("vllm-serve", info)  # `loadgen schema vllm-serve`
    assert info["models"] == ["standin"] and info["engine_notes"]["ready_s"] >= info["ready_s"] - 0.05
    child = int(child_file.read_text())
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    time.sleep(0.2)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_engine_report_merges_manifest_log_and_metrics(tmp_path):
    """A run dir's report: manifest engine_notes first, then vllm.log, then the scraped cache_config_info."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loadgen.rundir.schema import MANIFEST_FILE, SERVER_METRICS_FILE
    from loadgen.vllm import engine_report

    # an older writer put memory inside the log notes: the manifest stays open, so that run dir still reads
    old_log = {"max_model_len": 1234, "memory": {"rss_high_water_bytes": 5}}
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"engine_notes": {"log": old_log}}))
    (tmp_path / "vllm.log").write_text(CPU_LOG)
    labels = json.dumps({"block_size": "128", "num_gpu_blocks": "4096"})
    pq.write_table(
        pa.table({"name": ["vllm:num_requests_running", "vllm:cache_config_info"], "labels": ["{}", labels]}),
        tmp_path / SERVER_METRICS_FILE,
    )
    report = engine_report(tmp_path)
    assert report["max_model_len"] == 1234  # the manifest wins over the log's 2000
    assert report["memory"] == {"rss_high_water_bytes": 5}
    assert report["kv_cache_size_tokens"] == 512_000 and report["cache_config_info"]["num_gpu_blocks"] == "4096"
    assert report["sources"] == [
        str(tmp_path / MANIFEST_FILE),
        str(tmp_path / "vllm.log"),
        str(tmp_path / SERVER_METRICS_FILE),
    ]


def test_ledger_never_imports_engines():
    """The dependency runs engines → ledger (engines reconcile against the ledger), never the reverse."""
    import ast

    ledger = ROOT / "loadgen" / "ledger"
    for path in sorted(ledger.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")] + [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            assert not any("engines" in name for name in names), f"{path.name} imports {names}"


@pytest.mark.parametrize(
    ("arg", "said"),
    [
        ("'max_num_seqs': -4", "non_default_args.max_num_seqs = -4: expected a number in [1, "),
        ("'max_num_batched_tokens': 0", "non_default_args.max_num_batched_tokens = 0: expected a number in [1, "),
        ("'block_size': 'x'", "non_default_args.block_size = 'x': expected a whole number"),
        ("'max_model_len': True", "non_default_args.max_model_len = True: expected a finite number"),
    ],
)
@pytest.mark.parametrize("command", [["vllm", "parse-log"], ["ledger", "--model", LLAMA_JSON, "--reconcile"]])
def test_a_damaged_non_default_arg_is_one_line_naming_the_log(tmp_path, arg, said, command):
    """A count among the logged non-default args loadgen reads is checked where the log is read: the line names
    the file (it once said only "max_num_seqs = -4" from the ledger, with no file)."""
    from cli_process import run_loadgen

    log = tmp_path / "vllm.log"
    log.write_text(CPU_LOG.replace("'load_format': 'dummy'", f"'load_format': 'dummy', {arg}", 1))
    r = run_loadgen([*command, log], ROOT)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr[-500:]
    assert len(r.stderr.strip().splitlines()) == 1 and f"{log}: {said}" in r.stderr, r.stderr
