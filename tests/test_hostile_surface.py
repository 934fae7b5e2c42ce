"""Hostile input against the managed-API and sim surface through the real CLI: one line naming file, field and what was
expected, exit 2, no traceback, and never a key value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTANT = (ROOT / "scenarios" / "engines" / "instant.toml").read_text()
KEY = "sk-pasted-0123456789abcdef"


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=60
    )


def _refused(res: subprocess.CompletedProcess[str]) -> str:
    out = res.stdout + res.stderr
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in out, out
    return res.stderr


@pytest.mark.parametrize(
    "managed,expected",
    [
        ('path_prefix = "/.."', "managed.path_prefix = '/..': expected '' or /SEGMENT"),
        ('path_prefix = "/openai/../v1"', "managed.path_prefix = '/openai/../v1': expected '' or /SEGMENT"),
        ('path_prefix = "/./openai"', "managed.path_prefix = '/./openai': expected '' or /SEGMENT"),
        ('path_prefix = "/openai/"', "no trailing slash"),
        ('path_prefix = "/%2e%2e"', "managed.path_prefix = '/%2e%2e': expected"),
        (f'api_key_env = "{KEY}"', "managed.api_key_env (value not shown): expected the NAME of an environment"),
    ],
)
def test_sim_serve_refuses_an_unreachable_prefix_and_a_key_in_place_of_its_name(
    tmp_path: Path, managed: str, expected: str
) -> None:
    """Before: path_prefix '/..' or '/./openai' was served (every client resolves the dot segment away before
    sending, so nothing could reach it: GET /../v1/models went out as /v1/models, HTTP 404), and a key written as
    api_key_env was printed ('env var sk-... (managed.api_key_env) is empty')."""
    engine = tmp_path / "managed.toml"
    engine.write_text(f"{INSTANT}\n[managed]\n{managed}\n")
    err = _refused(cli("sim", "serve", "--engine", str(engine), "--port", "0"))
    assert f"{engine}: " in err and expected in err
    assert KEY not in err


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from loadgen.sim.worksheet import run_worksheet
    from loadgen.trace.generate import generate_trace_file
    from loadgen.workload.scenario import load_scenario

    tmp = tmp_path_factory.mktemp("one")
    trace = generate_trace_file(load_scenario(ROOT / "scenarios" / "canonical.toml"), "burst", tmp / "t.parquet", 1)
    return Path(run_worksheet(trace, "instant", tmp / "run", scenario=ROOT / "scenarios" / "canonical.toml"))


def test_managed_compare_refuses_a_run_against_itself(one_run: Path, tmp_path: Path) -> None:
    """The same directory (however spelled) or a copy of it on both sides: refused before anything is written
    (before: exit 0 and a report of identical columns, 'differences' of nothing)."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(one_run, copy)
    for other in (str(one_run), f"{one_run}/../{one_run.name}/", str(copy)):
        err = _refused(cli("managed", "compare", str(one_run), other, "--out", str(tmp_path / "r.md")))
        assert "are the same run: expected a local-engine run and a managed-endpoint run" in err
    assert not (tmp_path / "r.md").exists()


def test_an_output_file_that_is_a_directory_is_refused_before_the_work(one_run: Path, tmp_path: Path) -> None:
    """`sim validate --target URL --json DIR` ran the whole validation (its runs left under --out) and only then
    said 'is a directory'; now the flag is refused first, like a file a run directory owns."""
    taken = tmp_path / "taken"
    taken.mkdir()
    target = ("--target", "http://127.0.0.1:9", "--out", str(tmp_path / "v"))
    val = cli("sim", "validate", "instant", *target, "--json", str(taken))
    assert f"argument --json: {taken}: is a directory, expected a file to write" in _refused(val)
    assert not (tmp_path / "v").exists()
    cmp = cli("managed", "compare", str(one_run), str(one_run), "--out", str(taken))
    assert f"argument --out: {taken}: is a directory, expected a file to write" in _refused(cmp)


@pytest.mark.parametrize("spec", ["chars:99999999999999999999", "chars:1025", "chars: 4", "chars:\u0663"])
def test_a_chars_tokenizer_out_of_range_is_refused_in_the_engine_file(tmp_path: Path, spec: str) -> None:
    """Before: chars:99999999999999999999 started a server that answered every request HTTP 500 (an OverflowError
    building its text; a large-but-fitting N built gigabytes), and chars:\u0663 (an Arabic-Indic 3) passed as 3."""
    engine = tmp_path / "chars.toml"
    engine.write_text(INSTANT.replace('tokenizer = "cl100k_base"', f'tokenizer = "{spec}"'))
    err = _refused(cli("sim", "serve", "--engine", str(engine), "--port", "0"))
    assert f"{engine}: tokenizer = {spec!r}: expected chars:N with N an integer in 1..1024" in err


@pytest.mark.parametrize(
    "version,expected",
    [
        ('"x"', "field manifest_version: input should be a valid integer"),
        ("-1", "field manifest_version: input should be greater than or equal to 1 (got '-1')"),
    ],
)
def test_a_damaged_manifest_version_is_named_by_every_reader(
    one_run: Path, tmp_path: Path, version: str, expected: str
) -> None:
    """compare said a run with a damaged manifest was 'neither a run directory (manifest.json) nor a plan
    directory' (it has one), and manifest_version -1 was read as a run by analyze, diff, compare and managed
    compare alike."""
    import json
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(one_run, bad)
    text = json.dumps(json.loads((bad / "manifest.json").read_text()) | {"manifest_version": 0})
    (bad / "manifest.json").write_text(text.replace('"manifest_version": 0', f'"manifest_version": {version}'))
    for args in (("compare",), ("diff",), ("managed", "compare")):
        err = _refused(cli(*args, str(one_run), str(bad)))
        assert f"{bad / 'manifest.json'}: {expected}" in err and "neither a run directory" not in err
    assert f"{bad / 'manifest.json'}: {expected}" in _refused(cli("analyze", str(bad)))


def test_a_run_without_the_managed_stand_ins_key_is_refused_before_sending(one_run: Path, tmp_path: Path) -> None:
    """The [managed] stand-in listed its models to anyone and refused only the requests: a run without
    --api-key-env recorded every request as HTTP 401 and exited 0. A provider answers GET /v1/models 401 without
    the key, and so does the stand-in now: the run is refused in one line, no run directory, the key never shown."""
    from loadgen.targets import launch_sim_server

    engine = tmp_path / "keyed.toml"
    engine.write_text(f'{INSTANT}\n[managed]\napi_key_env = "LOADGEN_TEST_STANDIN_KEY"\npath_prefix = "/openai"\n')
    trace = next(one_run.parent.glob("*.parquet"))
    with launch_sim_server(str(engine), env={"LOADGEN_TEST_STANDIN_KEY": KEY}) as sim:
        res = cli("run", str(trace), "--target", f"{sim.base_url}/v1", "--out", str(tmp_path / "run"))
    err = _refused(res)
    assert "GET /v1/models answered HTTP 401: expected a valid API key (--api-key-env)" in err, err
    assert KEY not in err and not (tmp_path / "run").exists()
