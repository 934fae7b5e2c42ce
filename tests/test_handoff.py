"""Specialist handoff bundles: built from real simulated runs, verified, tampered with, rerun."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from result_schemas import assert_valid, schema_errors

from loadgen.analysis import analyze_run
from loadgen.handoff import build_bundle, rerun_bundle, toml_dumps, verify_bundle
from loadgen.sim.worksheet import run_worksheet
from loadgen.trace.generate import generate_trace_file
from loadgen.util.errors import RunDirError
from loadgen.workload.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "canonical.toml"
ENGINES = ROOT / "scenarios" / "engines"
EXPECTED_FILES = {
    "README.md",
    "identity.json",
    "workload.json",
    "scenario.toml",
    "trace.parquet",
    "runtime.json",
    "engine.toml",
    "failure.json",
    "experiment.json",
    "observed.json",
    "manifest.json",
    "contract/canonical.toml",
}


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def burst_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_trace_file(load_scenario(SCENARIO), "burst", tmp_path_factory.mktemp("trace") / "burst.parquet", 1)


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory: pytest.TempPathFactory, burst_trace: Path) -> Path:
    """The seed's fixture: throughput-large-batch breaches burst p99 TTFT (2 s batching window)."""
    return run_worksheet(
        burst_trace, "throughput-large-batch", tmp_path_factory.mktemp("runs") / "large", scenario=SCENARIO
    )


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, failing_run: Path):
    return build_bundle(failing_run, tmp_path_factory.mktemp("bundles") / "burst-ttft")


def test_bundle_holds_everything_a_specialist_needs(bundle, failing_run: Path) -> None:
    files = {p.relative_to(bundle.bundle_dir).as_posix() for p in bundle.bundle_dir.rglob("*") if p.is_file()}
    assert files == EXPECTED_FILES | {"SHA256SUMS"}
    assert bundle.tarball.is_file() and bundle.tarball.name == "burst-ttft.tar.gz"
    identity = json.loads((bundle.bundle_dir / "identity.json").read_text())
    assert identity["engine"]["name"] == "loadgen-sim" and identity["hardware"]["cpu_count"]
    assert identity["modelExecuted"] is False and identity["behavior_relevant"]["prefix_caching"] is True
    workload = json.loads((bundle.bundle_dir / "workload.json").read_text())
    assert workload["trace"]["name"] == "burst" and workload["trace"]["seed"] == 1
    assert workload["regenerate"] == "loadgen trace generate scenario.toml --trace burst --seed 1 --out trace.parquet"
    # the trace is the exact file, and it carries no text
    trace = pq.read_table(bundle.bundle_dir / "trace.parquet")
    assert not any("text" in name or name == "prompt" for name in trace.column_names)
    assert (bundle.bundle_dir / "scenario.toml").read_bytes() == SCENARIO.read_bytes()
    assert "window_ms = 2000" in (bundle.bundle_dir / "engine.toml").read_text()


def test_failing_threshold_matches_the_analysis(bundle, failing_run: Path) -> None:
    analysis = analyze_run(failing_run)
    failure = json.loads((bundle.bundle_dir / "failure.json").read_text())
    burst = next(f for f in failure["failures"] if f["class"] == "burst" and f["metric"] == "ttft_ms")
    check = next(c for c in analysis.hard_failures if c.class_name == "burst" and c.metric == "ttft_ms")
    assert burst["percentile"] == "p99" and burst["limit"] == 2000
    assert burst["observed"] == pytest.approx(check.observed) and burst["observed"] > 2000
    assert burst["samples"] == check.n > 100
    assert failure["failures"][0]["metric"] == "ttft_ms"  # TTFT first: what the handoff is about
    readme = (bundle.bundle_dir / "README.md").read_text()
    assert f"| burst | ttft_ms | p99 | 2000.0 | {burst['observed']:.1f} | {check.n} |" in readme


def test_one_variable_experiment_is_a_proposal(bundle) -> None:
    e = json.loads((bundle.bundle_dir / "experiment.json").read_text())
    assert (e["variable"], e["from"], e["to"]) == ("batching.window_ms", 2000.0, 1000.0)
    assert e["status"].startswith("proposal")
    readme = (bundle.bundle_dir / "README.md").read_text()
    assert "## Rerun with one command" in readme and "loadgen handoff rerun burst-ttft --out rerun-run" in readme
    assert "does not diagnose kernels or prescribe kernel work" in readme
    assert "kernel rewrite" not in readme.lower()


def test_verify_dir_and_tarball_and_name_the_first_bad_file(bundle, tmp_path: Path) -> None:
    assert verify_bundle(bundle.bundle_dir).ok and verify_bundle(bundle.tarball).ok
    ok = cli("handoff", "verify", str(bundle.tarball))
    assert ok.returncode == 0 and "OK (12 files" in ok.stdout
    # a copy we can damage
    damaged = tmp_path / "copy"
    with tarfile.open(bundle.tarball) as tar:
        tar.extractall(damaged, filter="data")
    copy = damaged / "burst-ttft"
    assert verify_bundle(copy).ok
    with open(copy / "trace.parquet", "ab") as handle:
        handle.write(b"\0")
    res = cli("handoff", "verify", str(copy))
    assert res.returncode == 1 and "FAILED: trace.parquet: sha256" in res.stderr
    (copy / "notes.txt").write_text("added later")
    (copy / "experiment.json").unlink()
    problems = verify_bundle(copy).problems
    assert problems[0].startswith("experiment.json: listed in SHA256SUMS but missing")
    assert any(p.startswith("notes.txt: not listed") for p in problems)
    # a tarball whose member was changed
    bad_tar = tmp_path / "bad.tar.gz"
    with tarfile.open(bundle.tarball) as src, tarfile.open(bad_tar, "w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()
            if member.name.endswith("failure.json"):
                data = data.replace(b"ttft_ms", b"TTFT_MS")
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    res = cli("handoff", "verify", str(bad_tar))
    assert res.returncode == 1 and "failure.json" in res.stderr


def test_tarball_has_one_top_folder_in_sorted_order_with_fixed_mtimes(bundle) -> None:
    with gzip.open(bundle.tarball) as g:
        members = tarfile.open(fileobj=io.BytesIO(g.read())).getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and all(n.startswith("burst-ttft/") for n in names)
    assert {m.mtime for m in members} == {0} and {m.uid for m in members} == {0}


def test_rerun_reproduces_and_experiment_applies(bundle, tmp_path: Path) -> None:
    result = rerun_bundle(bundle.bundle_dir, tmp_path / "rerun")
    assert result.reproduced is True
    burst = next(c for c in result.checks if c["class"] == "burst" and c["percentile"] == "p99")
    assert burst["rerun_observed"] == pytest.approx(burst["observed"])  # virtual time: deterministic
    res = cli(
        "handoff",
        "rerun",
        bundle.bundle_dir.name,
        "--out",
        str(tmp_path / "exp"),
        "--experiment",
        cwd=bundle.bundle_dir.parent,
    )
    assert res.returncode == 0, res.stderr
    assert "experiment applied: batching.window_ms 2000 → 1000.0" in res.stdout
    exp = rerun_bundle(bundle.bundle_dir, tmp_path / "exp2", experiment=True)
    new_burst = next(c for c in exp.checks if c["class"] == "burst" and c["percentile"] == "p99")
    assert new_burst["rerun_observed"] < burst["observed"]  # the proposal is testable, its outcome measured


def test_memory_failure_proposes_fewer_sequences(tmp_path: Path, burst_trace: Path) -> None:
    engine = tmp_path / "tiny-kv.toml"
    text = (ENGINES / "interactive-small-batch.toml").read_text()
    engine.write_text(
        text.replace('name = "interactive-small-batch"', 'name = "tiny-kv"', 1).replace(
            "num_kv_blocks = ", "num_kv_blocks = 300 #", 1
        )
    )
    run = run_worksheet(burst_trace, engine, tmp_path / "run", scenario=SCENARIO)
    info = build_bundle(run, tmp_path / "mem")
    signals = {f["metric"]: f for f in info.failures if f["class"] == "overall"}
    assert signals["preemptions"]["observed"] > 0 and signals["preemptions"]["samples"] > 0
    assert signals["kv_cache_saturated"]["observed"] >= 0.99
    assert (
        info.experiment["variable"] == "scheduler.max_num_seqs"
        and info.experiment["to"] == info.experiment["from"] // 2
    )
    assert (tmp_path / "mem" / "engine.toml").read_text() == engine.read_text()


def test_passing_run_is_bundled_saying_nothing_failed_and_plan_dir_picks_failure(
    tmp_path: Path, burst_trace: Path, failing_run: Path
) -> None:
    plan = tmp_path / "plan"
    good = run_worksheet(burst_trace, "instant", plan / "cell-00-instant", scenario=SCENARIO)
    info = build_bundle(good, tmp_path / "ok-bundle")
    assert info.failures == []
    readme = (tmp_path / "ok-bundle" / "README.md").read_text()
    assert "No hard budget failed" in readme
    assert json.loads((tmp_path / "ok-bundle" / "failure.json").read_text())["note"].startswith("nothing failed")
    # a plan directory: the first run with a failure is the one handed off
    import shutil

    shutil.copytree(failing_run, plan / "cell-01-large")
    res = cli("handoff", str(plan), "--out", str(tmp_path / "from-plan"))
    assert res.returncode == 0, res.stderr
    assert "from run: " + str(plan / "cell-01-large") in res.stdout
    assert "failed: burst ttft_ms p99" in res.stdout


def test_errors_are_one_line(tmp_path: Path, bundle) -> None:
    res = cli("handoff", str(tmp_path / "missing"), "--out", str(tmp_path / "b"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "no such directory" in res.stderr
    (tmp_path / "nonempty").mkdir()
    (tmp_path / "nonempty" / "x").write_text("x")
    with pytest.raises(RunDirError, match="not empty"):
        build_bundle(bundle.run_dir, tmp_path / "nonempty")
    res = cli("handoff", "verify")
    assert res.returncode == 2 and "expected exactly one BUNDLE" in res.stderr


def test_toml_writer_round_trips() -> None:
    import tomllib

    data = {
        "name": "x",
        "n": 3,
        "f": 0.5,
        "flag": True,
        "list": [1, 2],
        "none": None,
        "t": {"a": 'b"q', "inner": {"z": [{"k": 1}]}},
        "odd key": 1,
    }
    back = tomllib.loads(toml_dumps(data))
    data.pop("none")
    assert back == data


@pytest.mark.slow  # two 5 s live runs against the simulated engine's server
def test_live_sim_run_bundle_reruns_against_a_fresh_live_server(tmp_path: Path) -> None:
    from loadgen.driver import RunOptions, run_trace_sync
    from loadgen.targets import launch_sim_server as start_sim_server

    text = SCENARIO.read_text().replace("duration_s = 60", "duration_s = 5")
    (tmp_path / "contract").mkdir()
    (tmp_path / "contract" / "canonical.toml").write_text(
        (ROOT / "scenarios" / "contract" / "canonical.toml").read_text()
    )
    (tmp_path / "scenario.toml").write_text(text)
    trace = generate_trace_file(load_scenario(tmp_path / "scenario.toml"), "burst", tmp_path / "burst.parquet", 2)
    with start_sim_server("throughput-large-batch") as sim:
        run = run_trace_sync(
            RunOptions(
                trace_path=trace,
                target_url=sim.base_url,
                out_dir=tmp_path / "run",
                scenario_path=tmp_path / "scenario.toml",
                progress="off",
            )
        )
    info = build_bundle(run, tmp_path / "live")
    assert (tmp_path / "live" / "engine.toml").read_text() == (ENGINES / "throughput-large-batch.toml").read_text()
    assert any(f["metric"] == "ttft_ms" for f in info.failures)
    # the live server's own settings are on record (its /version), so the proposal names a concrete value
    engine = json.loads((run / "manifest.json").read_text())["target"]["engine"]
    assert engine["config"]["name"] == "throughput-large-batch" and engine["config"]["sha256"]
    assert engine["config"]["config"]["scheduler"]["max_num_seqs"] == 256
    experiment = json.loads((tmp_path / "live" / "experiment.json").read_text())
    assert experiment["from"] is not None and not isinstance(experiment["to"], str), experiment
    # the engine file is the one the server ran (its path and sha256 are on record), not a preset found by name
    assert "| engine.toml | simulated engine config (original file) |" in (tmp_path / "live" / "README.md").read_text()
    result = rerun_bundle(tmp_path / "live", tmp_path / "rerun")
    assert result.reproduced is True
    assert json.loads((result.run_dir / "manifest.json").read_text())["handoff"]["bundle"] == str(tmp_path / "live")


def test_missing_originals_are_rebuilt_from_the_manifest(tmp_path: Path) -> None:
    """Scenario, engine config and trace moved away after the run: the bundle still reproduces it."""
    scen = tmp_path / "scenario.toml"
    scen.write_text(SCENARIO.read_text().replace('cases = ["contract/canonical.toml"]', "cases = []"))
    engine = tmp_path / "engine.toml"
    engine.write_text((ENGINES / "throughput-large-batch.toml").read_text())
    trace = generate_trace_file(load_scenario(scen), "burst", tmp_path / "burst.parquet", 4)
    run = run_worksheet(trace, engine, tmp_path / "run", scenario=scen)
    for path in (scen, engine, trace):
        path.unlink()
    info = build_bundle(run, tmp_path / "rebuilt")
    workload = json.loads((info.bundle_dir / "workload.json").read_text())
    assert "regenerated" in workload["trace"]["note"] and "rebuilt" in workload["scenario"]["note"]
    assert (info.bundle_dir / "contract" / "NONE.txt").is_file()
    result = rerun_bundle(info.bundle_dir, tmp_path / "rerun")
    assert result.reproduced is True
    original = next(c for c in result.checks if c["class"] == "burst" and c["percentile"] == "p99")
    assert original["rerun_observed"] == pytest.approx(original["observed"])  # same trace content, same engine


def _unpacked_copy(bundle, dest: Path) -> Path:
    with tarfile.open(bundle.tarball) as tar:
        tar.extractall(dest, filter="data")
    copy = dest / bundle.bundle_dir.name
    assert verify_bundle(copy).ok
    return copy


def _tar_with(bundle, dest: Path, extra: tarfile.TarInfo, data: bytes | None = None) -> Path:
    """The bundle's tarball plus one more member (all the original members still match their sums)."""
    with tarfile.open(bundle.tarball) as src, tarfile.open(dest, "w:gz") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member))
        dst.addfile(extra, io.BytesIO(data) if data is not None else None)
    return dest


def test_verify_refuses_a_symlink_out_of_the_bundle_even_when_its_sum_matches(bundle, tmp_path: Path) -> None:
    copy = _unpacked_copy(bundle, tmp_path / "copy")
    outside = tmp_path / "outside.parquet"
    outside.write_bytes((copy / "trace.parquet").read_bytes())  # the same bytes: the checksum would pass
    (copy / "trace.parquet").unlink()
    (copy / "trace.parquet").symlink_to(outside)
    result = verify_bundle(copy)
    assert not result.ok and result.first_problem.startswith("trace.parquet: a symbolic link (to ")
    res = cli("handoff", "verify", str(copy))
    assert (
        res.returncode == 1 and res.stderr.count("\n") == 1 and "FAILED: trace.parquet: a symbolic link" in res.stderr
    )
    with pytest.raises(RunDirError, match="does not verify: trace.parquet: a symbolic link"):
        rerun_bundle(copy, tmp_path / "rerun")


def test_verify_refuses_a_linked_folder_a_hard_link_and_a_fifo(bundle, tmp_path: Path) -> None:
    copy = _unpacked_copy(bundle, tmp_path / "a")
    shutil.copytree(copy / "contract", tmp_path / "contract-elsewhere")
    shutil.rmtree(copy / "contract")
    (copy / "contract").symlink_to(tmp_path / "contract-elsewhere", target_is_directory=True)
    assert verify_bundle(copy).first_problem.startswith("contract: a symbolic link")

    copy = _unpacked_copy(bundle, tmp_path / "b")
    os.link(copy / "experiment.json", tmp_path / "second-name.json")  # a file outside shares its inode
    assert verify_bundle(copy).first_problem.startswith("experiment.json: a hard link")

    copy = _unpacked_copy(bundle, tmp_path / "c")
    os.mkfifo(copy / "pipe")
    assert verify_bundle(copy).first_problem == "pipe: a device, FIFO or socket: a bundle holds only regular files"


@pytest.mark.parametrize(
    "kind,name,linkname,expected",
    [
        (tarfile.SYMTYPE, "burst-ttft/notes.txt", "/etc/passwd", "a symbolic link (to /etc/passwd)"),
        (tarfile.LNKTYPE, "burst-ttft/notes.txt", "burst-ttft/README.md", "a hard link (to burst-ttft/README.md)"),
        (tarfile.CHRTYPE, "burst-ttft/dev", "", "a device or FIFO entry"),
        (tarfile.FIFOTYPE, "burst-ttft/pipe", "", "a device or FIFO entry"),
        (tarfile.REGTYPE, "burst-ttft/../escaped.txt", "", "the archive entry's path leaves the bundle"),
        (tarfile.REGTYPE, "/tmp/absolute.txt", "", "the archive entry's path leaves the bundle"),
    ],
)
def test_verify_refuses_tar_links_devices_and_escaping_paths(
    bundle, tmp_path: Path, kind, name, linkname, expected
) -> None:
    extra = tarfile.TarInfo(name)
    extra.type, extra.linkname = kind, linkname
    data = b"x" if kind == tarfile.REGTYPE else None
    extra.size = len(data or b"")
    bad = _tar_with(bundle, tmp_path / "bad.tar.gz", extra, data)
    result = verify_bundle(bad)
    assert not result.ok and result.first_problem.startswith(f"{name}: {expected}: a bundle holds only")
    res = cli("handoff", "verify", str(bad))
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and f"FAILED: {name}: {expected}" in res.stderr


def test_verify_refuses_a_checksum_line_naming_a_path_outside(bundle, tmp_path: Path) -> None:
    copy = _unpacked_copy(bundle, tmp_path / "copy")
    with open(copy / "SHA256SUMS", "a") as handle:
        handle.write("0" * 64 + "  ../../outside.txt\n")
    assert verify_bundle(copy).first_problem == (
        "SHA256SUMS: line 13 names '../../outside.txt', a path that leaves the bundle: expected a name inside it"
    )


def test_bundle_refuses_a_secret_the_server_echoed_into_the_manifest(
    failing_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A /version body echoing the Authorization header must not reach any bundle file."""
    run = tmp_path / "run"
    shutil.copytree(failing_run, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["options"]["api_key_env"] = "LOADGEN_HANDOFF_TEST_KEY"
    manifest["target"]["version"] = {"engine": "echo", "headers": {"authorization": "Bearer sk-test-0123456789"}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("LOADGEN_HANDOFF_TEST_KEY", "sk-test-0123456789")
    with pytest.raises(RunDirError, match=r"would contain the value of \$LOADGEN_HANDOFF_TEST_KEY: refusing"):
        build_bundle(run, tmp_path / "leaky")
    assert not (tmp_path / "leaky").exists() and not (tmp_path / "leaky.tar.gz").exists()
    # the same run without the echo bundles fine: only the key's value is refused, not its variable's name
    manifest["target"]["version"] = {"engine": "echo"}
    (run / "manifest.json").write_text(json.dumps(manifest))
    info = build_bundle(run, tmp_path / "clean")
    assert "LOADGEN_HANDOFF_TEST_KEY" in (info.bundle_dir / "runtime.json").read_text()


def _with_runtime_key_env(bundle, dest: Path, value: object) -> Path:
    """A copy of the bundle whose runtime.json options.api_key_env is ``value``, SHA256SUMS summed again."""
    runtime = json.loads((bundle.bundle_dir / "runtime.json").read_text())
    runtime["options"]["api_key_env"] = value
    return _with_runtime(bundle, dest, json.dumps(runtime).encode())


def _with_runtime(bundle, dest: Path, content: bytes) -> Path:
    """A copy of the bundle whose runtime.json holds ``content``, SHA256SUMS summed again (it verifies)."""
    return _with_file(bundle, dest, "runtime.json", content)


def _with_file(bundle, dest: Path, name: str, content: bytes) -> Path:
    """A copy of the bundle whose file ``name`` holds ``content``, SHA256SUMS summed again (it verifies)."""
    import hashlib

    copy = _unpacked_copy(bundle, dest)
    (copy / name).write_bytes(content)
    sums = copy / "SHA256SUMS"
    lines = [line.split("  ", 1)[1] for line in sums.read_text().splitlines()]
    sums.write_text("".join(f"{hashlib.sha256((copy / n).read_bytes()).hexdigest()}  {n}\n" for n in lines))
    assert verify_bundle(copy).ok
    return copy


@pytest.mark.parametrize(
    "value,expected",
    [
        ("sk-live-0123456789abcdef", "options.api_key_env: expected the NAME of an environment variable"),
        (42, "options.api_key_env: expected a string (value not shown)"),
        ("", "options.api_key_env: expected the NAME of an environment variable"),
        ("LOADGEN_RERUN_UNSET_KEY", "options.api_key_env = 'LOADGEN_RERUN_UNSET_KEY': variable unset or empty"),
    ],
)
def test_rerun_refuses_a_runtime_key_env_that_is_no_usable_name(
    bundle, sim_server, tmp_path: Path, value: object, expected: str
) -> None:
    """runtime.json's api_key_env holding a key, a number or nothing, or naming an unset variable: one line naming
    runtime.json, exit 2, no run directory, never the key (before: a pydantic traceback for the first three, and
    '--api-key-env NAME' for the last, a flag the user never passed)."""
    copy = _with_runtime_key_env(bundle, tmp_path / "copy", value)
    sim = sim_server("instant")
    env = {k: v for k, v in os.environ.items() if k != "LOADGEN_RERUN_UNSET_KEY"}
    res = subprocess.run(
        [sys.executable, "-m", "loadgen", "handoff", "rerun", str(copy), "--out", str(tmp_path / "rerun")]
        + ["--target", sim.base_url, "--model", "loadgen-sim"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(env, PYTHONPATH=str(ROOT)),
    )
    out = res.stdout + res.stderr
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in out, out
    assert f"{copy / 'runtime.json'}: {expected}" in res.stderr
    assert "0123456789abcdef" not in out and not (tmp_path / "rerun").exists()


@pytest.mark.parametrize(
    "content,expected",
    [
        (b"{not json", "runtime.json: invalid JSON at line 1 column 2: expected the bundle's runtime.json"),
        (b"\xff\xfe", "runtime.json: not UTF-8 (byte 0): expected the bundle's runtime.json"),
        (b"[]", "runtime.json: top level is a JSON array: expected the bundle's runtime.json (a JSON object)"),
        (b'{"options": "x"}', "runtime.json: options: not a JSON object: expected the run's options"),
    ],
)
def test_rerun_of_a_summed_but_damaged_runtime_json_is_one_line(
    bundle, tmp_path: Path, content: bytes, expected: str
) -> None:
    """A bundle whose runtime.json was replaced and summed again verifies; its rerun died with a JSONDecodeError,
    UnicodeDecodeError or AttributeError traceback (exit 1). Now one line naming the file, exit 2, nothing made."""
    copy = _with_runtime(bundle, tmp_path / "copy", content)
    res = cli("handoff", "rerun", str(copy), "--out", str(tmp_path / "rerun"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"{copy / expected}" in res.stderr and not (tmp_path / "rerun").exists()


def _cli_ok(*args: str, cwd: Path, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    res = cli(*args, cwd=cwd)
    assert res.returncode in ok, res.stderr[-2000:]
    return res


@pytest.mark.slow  # ~15 s: a bundle and two worksheet reruns, each through the CLI
def test_handoff_json_outputs_validate(tmp_path: Path, failing_run: Path) -> None:
    """`handoff RUN --json`, `handoff verify --json` (a good bundle and a damaged one) and `handoff rerun --json`
    (plain and with the experiment applied) conform to handoff-build, handoff-verify and handoff-rerun."""
    build = json.loads(_cli_ok("handoff", str(failing_run), "--out", "b", "--json", cwd=tmp_path).stdout)
    assert_valid("handoff-build", build)
    assert build["failures"] and build["experiment"]["variable"] and build["run_dir"] == str(failing_run)
    verify = json.loads(_cli_ok("handoff", "verify", "b", "--json", cwd=tmp_path).stdout)
    assert_valid("handoff-verify", verify)
    assert verify["ok"] and verify["files_checked"] > 0 and verify["problems"] == []
    shutil.copytree(tmp_path / "b", tmp_path / "bad")
    (tmp_path / "bad" / "README.md").write_text("changed\n")
    bad = _cli_ok("handoff", "verify", "bad", "--json", cwd=tmp_path, ok=(1,))
    damaged = json.loads(bad.stdout)  # exit 1, and the JSON still says why
    assert_valid("handoff-verify", damaged)
    assert not damaged["ok"] and damaged["problems"][0].startswith("README.md")
    for extra in ((), ("--experiment",)):
        out = f"rerun{len(extra)}"
        rerun = json.loads(_cli_ok("handoff", "rerun", "b", "--out", out, *extra, "--json", cwd=tmp_path).stdout)
        assert_valid("handoff-rerun", rerun)
        assert rerun["checks"] and rerun["run_dir"] == out
        assert (rerun["experiment_applied"] is not None) == bool(extra)
    rerun["checks"][0]["rerun_observed"] = "fast"
    assert any(e.startswith("checks/0/rerun_observed") for e in schema_errors("handoff-rerun", rerun))


def _edited(bundle, name: str, edit) -> bytes:
    data = json.loads((bundle.bundle_dir / name).read_text())
    edit(data)
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    ("name", "edit", "expected"),
    [
        ("failure.json", lambda d: d.update(failures="x"), "failure.json: failures = 'x': expected"),
        ("failure.json", lambda d: d.update(failures=[7]), "failure.json: failures[0] = 7: expected"),
        ("failure.json", lambda d: d["failures"][0].update(limit="fast"), "failure.json: failures[0].limit"),
        ("experiment.json", lambda d: d.pop("to"), "experiment.json: to: missing; required"),
        ("experiment.json", lambda d: d.update(variable=["a"]), "experiment.json: variable = ['a']: expected"),
    ],
)
def test_rerun_of_a_summed_but_edited_failure_or_experiment_is_one_line(
    bundle, tmp_path: Path, name: str, edit, expected: str
) -> None:
    """failure.json and experiment.json are typed (schemas handoff-failure, handoff-experiment): the builder writes
    them through their models and the rerun reads them back through them. Edited and summed again, they verify;
    their rerun ended in a traceback (an AttributeError, a KeyError, or the rerun result's own validation after
    the whole replay). Now one line naming the file and the field, exit 2, nothing run."""
    copy = _with_file(bundle, tmp_path / "copy", name, _edited(bundle, name, edit))
    res = cli("handoff", "rerun", str(copy), "--out", str(tmp_path / "rerun"), "--experiment")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"{copy / expected}" in res.stderr and not (tmp_path / "rerun").exists()


def test_the_bundle_findings_validate_against_their_schemas(bundle) -> None:
    assert_valid("handoff-failure", json.loads((bundle.bundle_dir / "failure.json").read_text()))
    assert_valid("handoff-experiment", json.loads((bundle.bundle_dir / "experiment.json").read_text()))
    assert_valid("handoff-workload", json.loads((bundle.bundle_dir / "workload.json").read_text()))
    observed = json.loads((bundle.bundle_dir / "observed.json").read_text())
    assert_valid("handoff-observed", observed)
    assert "timeseries" not in observed and "timeseries" not in (observed["server"] or {})


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished plan (plan.json, region.json, one cell) on the simulated engine."""
    from loadgen.plan import load_plan, run_plan
    from loadgen.targets import WorksheetTarget

    work = tmp_path_factory.mktemp("plan")
    (work / "plan.toml").write_text(
        f'name = "h"\nscenario = "{SCENARIO}"\ntrace = "steady"\nduration_s = 5\nclasses = ["short-message"]\n'
        "concurrency = [8]\nrates_rps = [2]\nrepeats = 1\n[stops]\ncontract_every_cell = false\n"
    )
    run_plan(load_plan(work / "plan.toml"), WorksheetTarget("instant"), work / "plan")
    return work / "plan"


@pytest.mark.parametrize(
    ("name", "damage", "said"),
    [
        ("plan.json", lambda _: "{not json", "plan.json: "),
        ("plan.json", lambda _: '{"kind": "loadgen.plan", "version": "x"}', "plan.json: "),
        ("plan.json", lambda _: "[]", "plan.json: "),
        ("plan.json", lambda t: t.replace('"loadgen.plan"', '"loadgen.run"'), "plan.json: kind = 'loadgen.run'"),
        ("region.json", lambda _: "\x00\xff garbage", "region.json: "),
        ("region.json", lambda t: json.dumps({**json.loads(t), "classes": 5}), "region.json: classes = 5"),
        ("region.json", lambda t: json.dumps({**json.loads(t), "version": 9}), "region.json: version = 9"),
    ],
)
def test_a_plan_dir_with_a_damaged_plan_or_region_file_is_refused_before_bundling(
    tmp_path: Path, plan_dir: Path, name: str, damage: Callable[[str], str], said: str
) -> None:
    plan = tmp_path / "plan"
    shutil.copytree(plan_dir, plan)
    (plan / name).write_text(damage((plan / name).read_text()))
    res = cli("handoff", str(plan), "--out", str(tmp_path / "b"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr and said in res.stderr, res.stderr
    assert str(plan / name) in res.stderr, res.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.tar.gz").exists()


def test_a_sound_plan_dir_is_bundled(tmp_path: Path, plan_dir: Path) -> None:
    res = cli("handoff", str(plan_dir), "--out", str(tmp_path / "b"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "b.tar.gz").is_file()
