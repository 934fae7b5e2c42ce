"""CPU pinning: client and launched engines on separate cores, recorded in the manifest, flagged when shared.

A launched "vLLM" here is the stand-in of ``test_plan_vllm`` (it execs the simulated engine's live server),
so the launcher, its exec wrapper, the environment vLLM would read and the driver all run for real; the
stand-in prints the CPUs it may run on and the OpenMP binding it was given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_plan_vllm import standin_vllm  # noqa: F401  (fixture)
from test_records_survive import make_trace

from loadgen.util.childproc import ChildProcess
from loadgen.util.errors import LoadgenError
from loadgen.util.pinning import ENGINE_CPUS_ENV, affinity, format_cpus, parse_cpus, pin, shared_cpus_warning

REPO = Path(__file__).resolve().parents[1]
USABLE = sorted(affinity() or {0})


def test_cpu_lists_round_trip_and_bad_lists_are_one_line() -> None:
    assert parse_cpus("0-2,5", check_usable=False) == {0, 1, 2, 5}
    assert format_cpus({5, 0, 1, 2}) == "0-2,5"
    assert format_cpus(parse_cpus("3,1-2,7", check_usable=False)) == "1-3,7"
    for bad in ("", "a", "2-1", "-1", "0-", "1,,2", "99999999"):
        with pytest.raises(LoadgenError, match="--cpus"):
            parse_cpus(bad, what="--cpus", check_usable=False)
    with pytest.raises(LoadgenError, match="not available here"):
        parse_cpus(str(max(USABLE) + 1))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for flag in ("--client-cpus", "--engine-cpus"):
        for value in ("x-1", str(max(USABLE) + 64)):
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "loadgen",
                    flag,
                    value,
                    "scenario",
                    "check",
                    str(REPO / "scenarios" / "canonical.toml"),
                ],
                capture_output=True,
                text=True,
                env=env,
            )
            assert proc.returncode == 2 and proc.stdout == "", proc.stderr
            assert proc.stderr.startswith(f"loadgen: error: {flag}: ") and proc.stderr.count("\n") == 1


def test_shared_cpu_warning_names_the_shared_cores() -> None:
    assert shared_cpus_warning(frozenset({1}), frozenset({0})) is None
    warning = shared_cpus_warning(frozenset({1, 2}), frozenset({0, 1}))
    assert warning is not None and "share CPUs 1:" in warning and "--engine-cpus" in warning
    unpinned = shared_cpus_warning(None, frozenset({0, 1}))  # an unpinned engine inherits the client's cores
    assert unpinned is not None and "share CPUs 0-1" in unpinned


def test_a_launched_child_runs_on_its_cpus_from_the_start(tmp_path: Path) -> None:
    want = frozenset({USABLE[-1]})
    child = ChildProcess(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)), flush=True)"],
        log_path=tmp_path / "child.log",
        what="probe",
        cpus=want,
    ).start()
    assert child.proc is not None and child.proc.wait(timeout=60) == 0
    assert child.log_text().strip() == str(sorted(want))


def _measure(tmp: Path, name: str) -> tuple[dict, str]:
    from loadgen.targets import VllmTarget
    from loadgen.targets.base import RunRequest, StateResult
    from loadgen.vllm import VllmConfig

    config = VllmConfig(model_dir=tmp, served_model_name="loadgen-sim", max_num_seqs=8)
    with VllmTarget(config, tmp / name / "logs", model="loadgen-sim", tokenizer="cl100k_base") as target:
        run_dir = target.run(
            RunRequest(
                make_trace(tmp / f"{name}.parquet", [50.0 * i for i in range(6)], 4),
                tmp / name / "run",
                StateResult("warm", True),
            )
        )
    manifest = json.loads((run_dir / "manifest.json").read_text())
    log = (run_dir / "vllm.log").read_text()
    return manifest, log


@pytest.mark.slow
def test_launched_vllm_is_pinned_apart_and_recorded(standin_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    tmp = standin_vllm
    # unpinned: the engine inherits the client's cores, and the run says so
    monkeypatch.delenv(ENGINE_CPUS_ENV, raising=False)
    manifest, log = _measure(tmp, "shared")
    assert manifest["driver"]["cpu_affinity"] == format_cpus(USABLE)
    assert manifest["target"]["engine"]["config"]["cpu_affinity"] is None
    assert any("share CPUs" in w for w in manifest["warnings"]), manifest["warnings"]
    assert f"standin cpus {USABLE} bind auto" in log
    if len(USABLE) < 2:
        pytest.skip(f"one usable CPU ({USABLE}): client and engine cannot be pinned apart here")
    # pinned apart: the client on the first core, the engine (and its OpenMP binding) on the last
    client, engine = frozenset(USABLE[:1]), frozenset(USABLE[-1:])
    monkeypatch.setenv(ENGINE_CPUS_ENV, format_cpus(engine))
    pin(0, client)
    try:
        manifest, log = _measure(tmp, "apart")
    finally:
        pin(0, frozenset(USABLE))
    assert manifest["driver"]["cpu_affinity"] == format_cpus(client)
    assert manifest["target"]["engine"]["config"]["cpu_affinity"] == format_cpus(engine)
    assert manifest["target"]["engine"]["config"]["env"]["VLLM_CPU_OMP_THREADS_BIND"] == format_cpus(engine)
    assert not any("share CPUs" in w for w in manifest["warnings"]), manifest["warnings"]
    assert f"standin cpus {sorted(engine)} bind {format_cpus(engine)}" in log


@pytest.mark.slow
def test_calibrate_and_validate_launch_vllm_pinned_apart(standin_vllm: Path) -> None:  # noqa: F811
    """``sim calibrate --vllm`` / ``sim validate --vllm`` launch the engine themselves, pinned apart from
    the client, and record where each ran; the stand-in serves a known preset behind vLLM's launcher."""
    tmp = standin_vllm
    apart = len(USABLE) >= 2
    pinning = ["--client-cpus", str(USABLE[0]), "--engine-cpus", str(USABLE[-1])] if apart else []
    env = {**os.environ}
    out = tmp / "fitted.toml"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "loadgen", *pinning, "sim", *args, "--vllm", str(tmp), "--json"]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)

    res = cli("calibrate", "--vllm-arg=--max-num-seqs=8", "--out", str(out))
    assert res.returncode == 0, res.stderr
    from loadgen.sim import load_engine_config

    cal = load_engine_config(out).calibration
    assert cal["calibrated"] and len(cal["calibration_runs"]) >= 5
    if apart:
        assert cal["pinning"] == {"client_cpus": str(USABLE[0]), "engine_cpus": str(USABLE[-1])}
        assert cal["runs_flagged_shared_cpus"] == []
    else:
        assert cal["runs_flagged_shared_cpus"], cal
    run = next(p for p in sorted((tmp / "fitted.calibration-runs").iterdir()) if (p / "manifest.json").is_file())
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["target"]["kind"] == "vllm" and "--max-num-seqs=8" in manifest["target"]["engine"]["config"]["args"]
    # held out: a configuration calibration never saw
    res = cli("validate", str(out), "--vllm-arg=--max-num-seqs=4", "--out", str(tmp / "val"), "--duration-s", "8")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["rows"]
    assert rows and all(r["request_class"] for r in rows)
    measured = next((tmp / "val").glob("*-measured/manifest.json"))
    config = json.loads(measured.read_text())["target"]["engine"]["config"]
    assert "--max-num-seqs=4" in config["args"]
    assert config["cpu_affinity"] == (str(USABLE[-1]) if apart else None)
