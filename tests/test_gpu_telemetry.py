"""GPU telemetry: skipped with the reason on this CPU host (manifest note), an error under ``on``; the NVML
sampling itself against a fake ``pynvml`` (the one thing that cannot exist here: an NVIDIA GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_driver_live import make_trace

from loadgen.driver import RunOptions, gpu_telemetry, run_trace_sync
from loadgen.driver.gpu_telemetry import GPU_METRICS, open_gpu_telemetry
from loadgen.rundir.io import load_run

REPO = Path(__file__).resolve().parents[1]


class FakeNVMLError(Exception):
    pass


def fake_nvml(gpus: int = 2, *, power_fails: bool = False, init_fails: bool = False) -> SimpleNamespace:
    """A stand-in for nvidia-ml-py with ``gpus`` devices whose readings change per call."""
    calls = {"util": 0, "shutdown": 0}

    def init() -> None:
        if init_fails:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def util(handle: int) -> SimpleNamespace:
        calls["util"] += 1
        return SimpleNamespace(gpu=10 * handle + calls["util"], memory=5)

    def power(handle: int) -> int:
        if power_fails:
            raise FakeNVMLError("Not Supported")
        return 250_000 + handle  # milliwatts

    return SimpleNamespace(
        calls=calls,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1),
        nvmlDeviceGetCount=lambda: gpus,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=141 << 30, used=(h + 1) << 30, free=0),
        nvmlDeviceGetUtilizationRates=util,
        nvmlDeviceGetPowerUsage=power,
    )


def test_sampler_reads_every_device_into_server_metrics_columns():
    nvml = fake_nvml(2)
    sampler, section = open_gpu_telemetry("auto", 0.5, nvml=nvml)
    assert sampler is not None and section["enabled"] is True and section["interval_s"] == 0.5
    assert [d["name"] for d in section["devices"]] == ["NVIDIA H200"] * 2
    assert section["devices"][1]["memory_total_bytes"] == 141 << 30 and set(section["metrics"]) == set(GPU_METRICS)
    cols = sampler.sample(anchor_ns=0)
    assert len(cols["name"]) == 6 and len(set(cols["time_ns"])) == 1
    got = {
        (n, json.loads(lab)["gpu"]): v for n, lab, v in zip(cols["name"], cols["labels"], cols["value"], strict=True)
    }
    assert got[("gpu:memory_used_bytes", "1")] == float(2 << 30)
    assert got[("gpu:power_watts", "0")] == 250.0 and got[("gpu:utilization_percent", "1")] == 12.0
    sampler.close()
    assert nvml.calls["shutdown"] == 1


def test_a_failing_reading_is_counted_and_the_rest_kept():
    sampler, _ = open_gpu_telemetry("on", 1.0, nvml=fake_nvml(1, power_fails=True))
    assert sampler is not None
    cols = sampler.sample(anchor_ns=0)
    assert sorted(cols["name"]) == ["gpu:memory_used_bytes", "gpu:utilization_percent"]
    assert sampler.failures == 1 and sampler.samples == 1


def test_skips_say_why():
    assert open_gpu_telemetry("off", 1.0, nvml=fake_nvml()) == (
        None,
        {"enabled": False, "reason": "turned off (--gpu-telemetry off)"},
    )
    sampler, section = open_gpu_telemetry("auto", 1.0, nvml=fake_nvml(init_fails=True))
    assert sampler is None and "NVML unavailable" in section["reason"] and "Not Found" in section["reason"]
    sampler, section = open_gpu_telemetry("auto", 1.0, nvml=fake_nvml(0))
    assert sampler is None and section["reason"] == "NVML lists no GPU on this host"


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.mark.skipif(_installed("pynvml"), reason="this host has nvidia-ml-py: the skip note is for hosts without it")
def test_a_run_on_this_cpu_host_notes_the_skip(tmp_path, sim_server):
    sim = sim_server("instant")
    trace = make_trace(
        tmp_path / "t.parquet", [{"request_id": f"r{i}", "scheduled_offset_ns": i * 1_000_000} for i in range(5)]
    )
    out = run_trace_sync(
        RunOptions(trace_path=trace, target_url=sim.base_url, out_dir=tmp_path / "run", progress="off")
    )
    section = load_run(out).manifest.to_dict()["gpu_telemetry"]
    assert section["enabled"] is False and "nvidia-ml-py" in section["reason"] and "loadgen[gpu]" in section["reason"]
    # --gpu-telemetry on where it cannot run: one line, exit 2, nothing sent
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "run", str(trace), "--target", sim.base_url, "--out", str(tmp_path / "on")]
        + ["--gpu-telemetry", "on"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("loadgen: error: --gpu-telemetry on: nvidia-ml-py")


def test_a_run_with_nvml_records_samples_on_the_run_clock(tmp_path, sim_server, monkeypatch):
    nvml = fake_nvml(1)
    monkeypatch.setattr(gpu_telemetry, "_import_nvml", lambda: nvml)
    sim = sim_server("instant")
    rows = [{"request_id": f"r{i}", "scheduled_offset_ns": i * 50_000_000} for i in range(20)]
    trace = make_trace(tmp_path / "t.parquet", rows)
    out = run_trace_sync(
        RunOptions(
            trace_path=trace,
            target_url=sim.base_url,
            out_dir=tmp_path / "run",
            progress="off",
            scrape_interval_s=0.2,
            gpu_telemetry="on",
        )
    )
    run = load_run(out)
    section = run.manifest.to_dict()["gpu_telemetry"]
    assert section["enabled"] is True and section["devices"][0]["name"] == "NVIDIA H200"
    sm = run.server_metrics.to_pylist()
    gpu_rows = [r for r in sm if r["name"].startswith("gpu:")]
    samples = sorted({r["time_ns"] for r in gpu_rows})
    assert section["samples"] == len(samples) >= 2  # the first sample and at least one more
    assert {r["name"] for r in gpu_rows} == set(GPU_METRICS)
    duration_ns = run.manifest.duration_s * 1e9
    assert -0.05e9 <= samples[0] < samples[-1] <= duration_ns  # on the run clock (the first may be in the lead time)
    assert nvml.calls["shutdown"] == 1
