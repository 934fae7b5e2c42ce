"""The typed run manifest: old manifests load, one merge rule, one-line errors, atomic writes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from loadgen.rundir import identity
from loadgen.rundir.manifest import (
    MANIFEST_VERSION,
    Manifest,
    amend_manifest,
    merge_manifest,
    read_manifest,
    write_manifest,
)
from loadgen.rundir.schema import MANIFEST_FILE
from loadgen.util.errors import RunDirError

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize("name", ["manifest-v1-measured.json", "manifest-v1-worksheet.json"])
def test_schema_1_manifests_load_with_every_section_typed(tmp_path: Path, name: str) -> None:
    shutil.copyfile(DATA / name, tmp_path / MANIFEST_FILE)
    old = json.loads((DATA / name).read_text())
    manifest = read_manifest(tmp_path)
    assert "manifest_version" not in old and manifest.manifest_version == MANIFEST_VERSION
    assert manifest.status_counts == old["status_counts"]
    assert manifest.warm_state.state == old["warm_state"]["state"]
    assert manifest.warm_state.actions == old["warm_state"]["actions"]
    assert manifest.trace is not None and manifest.trace.sha256 == old["trace"]["sha256"]
    assert manifest.model_executed is old["modelExecuted"] is False
    assert manifest.target.engine is not None and manifest.target.engine.name == "loadgen-sim"
    # nothing is lost in a read-write round trip: every old key survives with its value
    again = manifest.to_dict()
    for key, value in old.items():
        assert _without_new_nulls(again[key], value) == value, key


def test_a_manifest_written_at_9f05bca_reads_with_its_plan_target_typed(tmp_path: Path) -> None:
    """A plan cell's run on a launched simulated engine, written by the code at commit 9f05bca (before
    ``plan_target`` was typed): it reads, its ``plan_target`` is the sim server's typed identity, and a
    read-write round trip keeps every key and value as written."""
    shutil.copyfile(DATA / "manifest-9f05bca-sim-plan.json", tmp_path / MANIFEST_FILE)
    old = json.loads((DATA / "manifest-9f05bca-sim-plan.json").read_text())
    manifest = read_manifest(tmp_path)
    target = manifest.plan_target
    assert target is not None and target.kind == "sim" and target.engine == "instant"
    assert target.server_pid == old["plan_target"]["server_pid"] and target.server_starts == 1
    write_manifest(tmp_path, manifest)
    again = json.loads((tmp_path / MANIFEST_FILE).read_text())
    assert {k: again[k] for k in old} == old


@pytest.mark.parametrize(
    ("plan_target", "expected"),
    [
        ({"kind": "sim", "engine": "e", "engine_sha256": None, "engine_path": None}, "launched_by_loadgen"),
        ({"kind": "url", "base_url": "http://h", "model": None, "launched_by_loadgen": False}, "plan_target"),
        (
            {"kind": "vllm", "engine": "vllm:m", "engine_sha256": "0", "args": "--x", "launched_by_loadgen": True},
            "args",
        ),
    ],
)
def test_a_wrongly_typed_plan_target_is_one_line(tmp_path: Path, plan_target: dict, expected: str) -> None:
    """``plan_target`` was an open dict: any value read, and a reader asking for its engine found whatever was
    there. Now it is one of the launched targets' identities, told apart by kind; anything else is one line."""
    data = {**json.loads((DATA / "manifest-9f05bca-sim-plan.json").read_text()), "plan_target": plan_target}
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(RunDirError, match=expected) as refused:
        read_manifest(tmp_path)
    assert "\n" not in str(refused.value) and "plan_target" in str(refused.value)


def _without_new_nulls(new: object, old: object) -> object:
    """``new`` less the keys the model added as null/empty where ``old`` had none."""
    if isinstance(new, dict) and isinstance(old, dict):
        return {k: _without_new_nulls(v, old.get(k)) for k, v in new.items() if k in old or v not in (None, [], {})}
    return new


def test_merge_is_one_level_deep_and_validated() -> None:
    base = Manifest(driver={"mode": "open", "concurrency": 4}, warnings=["a"])
    merged = merge_manifest(base, {"driver": {"slot_waits": 3}, "warnings": ["b"], "modelExecuted": True})
    assert merged.driver is not None and (merged.driver.mode, merged.driver.concurrency, merged.driver.slot_waits) == (
        "open",
        4,
        3,
    )
    assert merged.warnings == ["b"] and merged.model_executed is True
    assert base.driver is not None and base.driver.slot_waits is None, "the input is not modified"
    with pytest.raises(RunDirError, match=r"field status_counts\.ok"):
        merge_manifest(base, {"status_counts": {"ok": "many"}})


def test_sections_keep_keys_the_model_does_not_name(tmp_path: Path) -> None:
    manifest = Manifest(
        target={"kind": "vllm", "version": {"version": "0.32.0", "build": "cpu"}, "region": "eu"},
        custom_section={"x": 1},
    )
    write_manifest(tmp_path, manifest)
    back = read_manifest(tmp_path)
    assert back.target.version == {"version": "0.32.0", "build": "cpu"}
    assert back.to_dict()["target"]["region"] == "eu" and back.to_dict()["custom_section"] == {"x": 1}


def test_amend_merges_on_disk_and_leaves_no_temp_file(tmp_path: Path) -> None:
    write_manifest(tmp_path, Manifest(engine_notes={"log": {"kv_tokens": 10}}))
    amend_manifest(tmp_path, {"engine_notes": {"memory": {"rss_max_bytes": 5}}})
    back = read_manifest(tmp_path)
    assert back.engine_notes.model_dump(mode="json") == {"log": {"kv_tokens": 10}, "memory": {"rss_max_bytes": 5}}
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST_FILE]


def test_non_finite_numbers_are_written_as_null(tmp_path: Path) -> None:
    write_manifest(tmp_path, Manifest(duration_s=float("nan"), engine_notes={"x": [float("inf"), 1.0]}))
    text = (tmp_path / MANIFEST_FILE).read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert read_manifest(tmp_path).duration_s is None


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"[1, 2]", "top level is a JSON array: expected a manifest object"),
        (b"\xff\xfe not utf-8", "not UTF-8"),
        (b'{"status_counts": [1]}', "field status_counts"),
        (b"{", "invalid JSON at line 1"),
    ],
)
def test_bad_manifests_give_one_line_naming_the_file(tmp_path: Path, content: bytes, expected: str) -> None:
    (tmp_path / MANIFEST_FILE).write_bytes(content)
    with pytest.raises(RunDirError) as info:
        read_manifest(tmp_path)
    message = str(info.value)
    assert "\n" not in message and str(tmp_path / MANIFEST_FILE) in message and expected in message


def test_git_sha_names_the_checkout_loadgen_runs_from() -> None:
    """From a git checkout the manifest's source commit is the checkout's HEAD (it was silently None when the
    module moved one folder down and looked for .git in loadgen/)."""
    repo = Path(identity.__file__).resolve().parents[2]
    if not (repo / ".git").exists() or shutil.which("git") is None:
        pytest.skip("loadgen is not running from a git checkout here (an installed wheel)")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    sha = identity.git_sha()
    assert sha is not None and sha.removesuffix("-dirty") == head


def test_a_directory_without_a_manifest_says_where_its_runs_are(tmp_path: Path) -> None:
    """`loadgen analyze runs/bench` (bench's --out, whose run is runs/bench/run) or a plan directory said only
    'no manifest.json'; the one line now names the run inside, or the plan's cells, or that the path is a file."""
    from cli_process import run_loadgen

    bench = tmp_path / "bench"
    (bench / "run").mkdir(parents=True)
    shutil.copyfile(DATA / "manifest-v1-measured.json", bench / "run" / MANIFEST_FILE)
    plan = tmp_path / "plan"
    plan.mkdir()
    (plan / "plan.json").write_text("{}")
    (tmp_path / "t.parquet").write_bytes(b"")
    expected = {
        "plan": "plan: a plan directory (plan.json; its runs are under plan/cells, and loadgen compare takes it whole)",
        "t.parquet": "t.parquet: a file, not a directory",
        "nope": "nope: no such directory",
    }
    for name, line in expected.items():
        with pytest.raises(RunDirError) as info:
            read_manifest(tmp_path / name)
        assert line in str(info.value).replace(f"{tmp_path}/", ""), info.value
    out = run_loadgen(["analyze", "bench"], tmp_path)  # the command a newcomer types, as a user runs it
    line = "bench: no manifest.json (the run directory bench/run is inside it): expected a loadgen run directory"
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and line in out.stderr, out.stderr


# A run's manifest edited after it was written: analyze had echoed duration_s -5 (or 1e300) as the run's length
# and taken a negative status count; now the manifest's own model refuses it in one line, exit 2.
DAMAGED_FIGURES = [
    ("duration_s", -5.0, "field duration_s: input should be greater than or equal to 0"),
    ("duration_s", 1e300, "field duration_s: input should be less than or equal to 31622400"),
    ("requests_recorded", -1, "field requests_recorded: input should be greater than or equal to 0"),
    ("status_counts", {"ok": -3}, "field status_counts.ok: input should be greater than or equal to 0"),
]


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small simulated run (the canonical scenario for 2 s on the instant engine), built once."""
    from cli_process import run_loadgen

    where = tmp_path_factory.mktemp("sim-run")
    root = Path(__file__).resolve().parents[1]
    scenario = (root / "scenarios" / "canonical.toml").read_text()
    scenario = scenario.replace('cases = ["contract/canonical.toml"]', "cases = []")
    (where / "s.toml").write_text(
        scenario.replace("rate_rps = 4.0\nduration_s = 60", "rate_rps = 4.0\nduration_s = 2", 1)
    )
    engine = root / "scenarios" / "engines" / "instant.toml"
    for args in (
        ["trace", "generate", "s.toml", "--trace", "steady", "--out", "t.parquet"],
        ["sim", "run", "t.parquet", "--engine", engine, "--out", "run", "--scenario", "s.toml"],
    ):
        assert run_loadgen(args, where).returncode == 0
    return where / "run"


@pytest.mark.parametrize(("field", "value", "said"), DAMAGED_FIGURES, ids=[f"{c[0]}={c[1]}" for c in DAMAGED_FIGURES])
def test_analyze_refuses_a_manifest_figure_out_of_range(tmp_path, sim_run, field, value, said):
    from cli_process import run_loadgen

    shutil.copytree(sim_run, tmp_path / "run")
    path = tmp_path / "run" / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest[field] = value
    path.write_text(json.dumps(manifest))
    r = run_loadgen(["analyze", tmp_path / "run", "--quiet", "--json", tmp_path / "a.json"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert said in r.stderr and not (tmp_path / "a.json").exists()


# A worksheet run's engine notes edited after it was written, read by `compare` (the engine's busy-time rate):
# "fast" had been a traceback (ValueError in float()), -5 shown as the engine's rate; now one line, exit 2.
DAMAGED_ENGINE_RATES = [
    ("fast", "field engine_notes.output_tokens_per_busy_s: input should be a valid number"),
    (-5, "field engine_notes.output_tokens_per_busy_s: value error, expected a number in [0, 1e+12]"),
]


@pytest.mark.parametrize(("rate", "said"), DAMAGED_ENGINE_RATES, ids=[str(c[0]) for c in DAMAGED_ENGINE_RATES])
def test_compare_refuses_a_damaged_engine_rate_in_one_line(tmp_path, sim_run, rate, said):
    from cli_process import run_loadgen

    for name in ("a", "b"):
        shutil.copytree(sim_run, tmp_path / name)
    path = tmp_path / "a" / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest["engine_notes"] |= {"busy_s": 2.0, "output_tokens_per_busy_s": rate}
    path.write_text(json.dumps(manifest))
    r = run_loadgen(["compare", tmp_path / "a", tmp_path / "b", "--allow-differences", "--json"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert said in r.stderr and r.stdout == ""
