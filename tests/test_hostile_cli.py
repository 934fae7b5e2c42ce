"""Hostile inputs found by the s6b audit, through the real command (``python -m loadgen`` in a subprocess):
each is exit 2, exactly one ``loadgen: error:`` line naming the file (and field, where there is one), no
traceback, and nothing written. ``test_hostile_inputs.py`` holds the cases covered before the audit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_process import run_loadgen

REPO = Path(__file__).resolve().parents[1]
TINY = json.loads((REPO / "loadgen" / "data" / "models" / "tiny-llama-gqa.json").read_text())


def cli_fails(tmp_path: Path, args: list[object], *expected: str) -> str:
    """Run ``loadgen ARGS`` in ``tmp_path``; it must exit 2 with one stderr line holding every ``expected``."""
    proc = run_loadgen(args, tmp_path, LOADGEN_CATALOG=str(tmp_path / "catalog.duckdb"))
    err = proc.stderr
    assert "Traceback" not in err, err
    assert proc.returncode == 2, (proc.returncode, err)
    assert err.startswith("loadgen: error: ") and err.count("\n") == 1, err
    for text in expected:
        assert text in err, err
    return err


# ---- vllm make-model: the ledger's one config.json reader ------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"vocab_size": "\xff"}', "not UTF-8"),
        (b"[1, 2]", "top level is a JSON array"),
        (b"null", "top level is a JSON null"),
        (json.dumps({**TINY, "vocab_size": "abc"}).encode(), "vocab_size = 'abc': expected an integer"),
        (json.dumps({**TINY, "vocab_size": 4096.5}).encode(), "vocab_size = 4096.5: expected an integer"),
        (
            json.dumps({**TINY, "max_position_embeddings": "x"}).encode(),
            "max_position_embeddings = 'x': expected an integer",
        ),
    ],
)
def test_make_model_refuses_a_bad_config_before_writing(tmp_path, raw, expected):
    """Before: a traceback (UnicodeDecodeError, AttributeError on a list, ValueError on a string), and a bad
    max_position_embeddings left OUT/ half-written (tokenizer.json, no config.json)."""
    (tmp_path / "config.json").write_bytes(raw)
    cli_fails(tmp_path, ["vllm", "make-model", "config.json", "--out", "model"], "config.json", expected)
    assert not (tmp_path / "model").exists()


def test_make_model_reads_a_model_directory_as_the_ledger_does(tmp_path):
    """A directory is the model directory holding config.json (as ``loadgen ledger --model``), not a shipped name."""
    (tmp_path / "m").mkdir()
    cli_fails(tmp_path, ["vllm", "make-model", "m", "--out", "model"], "m/config.json: no such file")
    assert not (tmp_path / "model").exists()


# ---- run directories: the streaming chunk reader converts as the whole-table reader does -------------------


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-run")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    scenario = REPO / "scenarios" / "canonical.toml"
    for args in (
        ["trace", "generate", scenario, "--trace", "steady", "--out", "t.parquet"],
        ["sim", "run", "t.parquet", "--engine", "instant", "--out", "run"],
    ):
        subprocess.run([sys.executable, "-m", "loadgen", *map(str, args)], cwd=root, env=env, check=True)
    return root / "run"


def _retype_chunks(run: Path, tmp_path: Path, column: str, values: list[object]) -> Path:
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (part,) = sorted((copy / "chunks.parquet").glob("*.parquet"))
    table = pq.read_table(part)
    i = table.column_names.index(column)
    pq.write_table(table.set_column(i, column, pa.array(values * table.num_rows)), part)
    return part


@pytest.mark.parametrize(("column", "value"), [("tokens", "zz"), ("arrival_ns", 1.5)])
def test_a_chunk_column_of_the_wrong_type_names_its_file(run_dir, tmp_path, column, value):
    """Before: ``analyze`` ended in a pyarrow ArrowInvalid traceback raised from the chunk reader thread."""
    part = _retype_chunks(run_dir, tmp_path, column, [value])
    cli_fails(tmp_path, ["analyze", "run"], str(part.relative_to(tmp_path)), "a column of the wrong type")


# ---- files read through ad-hoc readers before the audit, now through util/jsonfile or util/tomlfile ------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"[1]", "top level is a JSON array"),
        (b"null", "top level is a JSON null"),
        (b"\xff", "not UTF-8"),
        (b'{"reference_diff": [1]}', "kind = None: expected 'loadgen.contract_result'"),
    ],
)
def test_compare_names_a_damaged_contract_json(run_dir, tmp_path, raw, expected):
    """Before: compare read a candidate's contract.json with json.loads and .get: AttributeError, TypeError or
    UnicodeDecodeError tracebacks. Now through the one contract reader (``read_contract``)."""
    import shutil

    shutil.copytree(run_dir, tmp_path / "run")
    (tmp_path / "run" / "contract.json").write_bytes(raw)
    cli_fails(tmp_path, ["compare", "run", run_dir, "--allow-differences"], "run/contract.json", expected)


def test_a_directory_given_for_a_file_says_what_was_expected(run_dir, tmp_path):
    """Before: the generic ``PATH: Is a directory`` line, without what the file should have been."""
    (tmp_path / "d").mkdir()
    cli_fails(tmp_path, ["compare", run_dir, run_dir, "--prices", "d"], "d: cannot read", "expected a price table")
    cli_fails(tmp_path, ["import", "vllm", "d", "--out", "o"], "d: cannot read", "expected a results JSON file")
    assert not (tmp_path / "o").exists()


def test_a_contract_schema_file_that_is_not_utf8_is_one_line(tmp_path):
    """Before: a UnicodeDecodeError traceback (only OSError and JSONDecodeError were caught)."""
    (tmp_path / "s.json").write_bytes(b'{"type": "\xff"}')
    (tmp_path / "cases.toml").write_text(
        'version = 1\n[defaults]\nmax_tokens = 32\n[[cases]]\nid = "t1"\n'
        'request.messages = [{ role = "user", content = "hi" }]\n'
        'checks = [{ kind = "schema", schema_file = "s.json" }]\n'
    )
    cli_fails(tmp_path, ["contract", "check", "cases.toml"], "cases.toml", "schema_file = 's.json'", "not UTF-8")


def test_export_refuses_a_non_run_directory_before_opening_the_store(tmp_path):
    """Before: the MLflow store (./mlflow.db) was created and its log lines printed, then the refusal came."""
    pytest.importorskip("mlflow")
    (tmp_path / "d").mkdir()
    cli_fails(tmp_path, ["export", "mlflow", "d"], "d: neither a run directory nor a plan directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_an_instant_beyond_what_a_double_holds_is_one_line(run_dir, tmp_path):
    """Before: ``analyze`` (and diff, compare, runs pareto, which analyze) ended in an ArrowInvalid traceback
    casting a done_ns of 2**62 to float64."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(run_dir, tmp_path / "run")
    (part,) = sorted((tmp_path / "run" / "requests.parquet").glob("*.parquet"))
    table = pq.read_table(part)
    i = table.column_names.index("done_ns")
    table = table.set_column(i, table.schema.field(i), pa.array([2**62] * table.num_rows, pa.int64()))
    pq.write_table(table.replace_schema_metadata(table.schema.metadata), part)
    for args in (["analyze", "run"], ["runs", "pareto", "run", run_dir]):
        cli_fails(
            tmp_path, args, "run/requests.parquet: done_ns", "4611686018427387904", "expected a value within 2**53"
        )


def test_a_directory_for_a_trace_says_so(tmp_path):
    """Before: ``PATH: no such file`` for a path that exists (a directory)."""
    (tmp_path / "t.parquet").mkdir()
    cli_fails(tmp_path, ["trace", "stats", "t.parquet"], "t.parquet: is a directory", "expected a trace Parquet file")


# ---- operator profiles and collectives tables (sim engine): one CSV reader, util.inputfile.read_input_csv ----

PROFILE = REPO / "scenarios" / "engines" / "profiles" / "RTX4090" / "meta-llama" / "Llama-3.1-8B" / "bf16"
LLAMA_CONFIG = REPO / "loadgen" / "data" / "models" / "llama-3.1-8b.json"


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        ("meta.yaml", b"\xff\xfe", "meta.yaml: not UTF-8 (byte 0)"),
        ("tp1/dense.csv", b"\xff\xfe\x00", "dense.csv: not UTF-8 (byte 0)"),
        ("tp1/dense.csv", b"x\n", "dense.csv: column 'layer': missing"),
        ("tp1/per_sequence.csv", b"layer,sequences,time_us\n", "per_sequence.csv: no rows"),
        pytest.param(
            "tp1/attention.csv",
            b'a\n"' + b"x" * 200_000 + b'"\n',
            "attention.csv: not CSV (field larger",
            id="huge-field",
        ),
    ],
)
def test_a_damaged_operator_profile_is_one_line(tmp_path, name, raw, expected):
    """Before: UnicodeDecodeError (meta.yaml, any table), csv.Error (a field past the csv limit), ``min() arg is an empty
    sequence`` (a table with no rows) or KeyError (no ``layer`` column) tracebacks."""
    import shutil

    shutil.copytree(PROFILE, tmp_path / "prof")
    (tmp_path / "prof" / name).write_bytes(raw)
    args = ["sim", "engine", "--profile", "prof", "--model-config", LLAMA_CONFIG, "--max-model-len", "4096"]
    cli_fails(tmp_path, [*args, "--out", "o.toml"], expected)
    assert not (tmp_path / "o.toml").exists()


def test_a_collectives_table_that_is_not_utf8_is_one_line(tmp_path):
    from loadgen.sim.link import read_collectives
    from loadgen.util.errors import ScenarioError

    (tmp_path / "c.csv").write_bytes(b"collective,ranks,bytes,us\n\xff")
    with pytest.raises(ScenarioError, match="c.csv: not UTF-8 .byte 26.: expected a measured-collectives CSV"):
        read_collectives(str(tmp_path / "c.csv"))


@pytest.mark.parametrize(
    ("raw", "column", "expected"),
    [
        (b"\xff\xfe1\n2\n", None, "emp.txt: not UTF-8 (byte 0): expected an empirical distribution"),
        (b"a,b\n1,2\n", "zz", "emp.txt: column 'zz': missing: expected an empirical distribution"),
    ],
)
def test_an_empirical_distribution_file_that_is_not_text_is_one_line(tmp_path, raw, column, expected):
    """Before: a UnicodeDecodeError traceback from trace generate (only OSError was caught)."""
    (tmp_path / "emp.txt").write_bytes(raw)
    dist = '{ dist = "empirical", file = "emp.txt"' + (f', column = "{column}"' if column else "") + " }"
    old = 'output_tokens = { dist = "lognormal", mean = 200, sigma = 0.5, min = 16, max = 1024 }'
    text = (REPO / "scenarios" / "canonical.toml").read_text()
    assert old in text
    (tmp_path / "s.toml").write_text(text.replace(old, f"output_tokens = {dist}", 1))
    cli_fails(tmp_path, ["trace", "generate", "s.toml", "--trace", "steady", "--out", "t.parquet"], expected)
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("config", ["[1]", '{"nodes": 5}', '{"nodes": [{"instances": 5}]}', "[" * 100_000])
def test_a_misshapen_cluster_config_beside_an_llmservingsim_run_is_no_hardware_tag(tmp_path, config):
    """The cluster config is read for hardware tags only, if any (an unreadable one already gave none); before,
    a well-formed JSON of another shape, or one nested too deeply, ended the import in a traceback."""
    run = tmp_path / "cfg" / "run"
    run.mkdir(parents=True)
    rec = {"request_id": "bench-0", "input_toks": 3, "output_toks": 2, "arrival_time": 10.0, "queued_ts": 5.0}
    rec |= {"scheduled_ts": 6.0, "first_token_ts": 6.5, "last_token_ts": 7.0}
    (run / "meta.json").write_text("{}")
    (run / "requests.jsonl").write_text(json.dumps(rec) + "\n")
    (tmp_path / "cfg" / "config.json").write_text(config)
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "import", "llmservingsim", "cfg/run", "--out", "o"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["source"]["cluster_hardware"] is None


def test_practice_reads_its_candidates_before_making_its_directory(tmp_path):
    """Before: a candidate engine TOML that is not TOML was refused after ``--out`` was created (left empty)."""
    (tmp_path / "bad.toml").write_bytes(b"\xff\x00")
    args = ["practice", "--candidate", "bad.toml", "--candidate", "instant", "--out", "p"]
    cli_fails(tmp_path, args, "bad.toml: invalid TOML", "expected an engine config TOML")
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["plan", REPO / "scenarios" / "plans" / "quick.toml", "--sim-worksheet", "instant"], "a plan directory"),
        (["vllm", "make-model", "tiny-llama-gqa"], "a model directory"),
        (["practice"], "a new output directory for the practice"),
        (["bench", "--scenario", REPO / "scenarios" / "canonical.toml"], "a directory for the bench run"),
    ],
)
def test_an_output_directory_that_is_a_file_says_what_was_expected(tmp_path, args, expected):
    """Before: ``f: File exists`` or ``f: Not a directory`` (the generic OSError line, no expectation), through
    util.outputfile.make_output_dir now."""
    (tmp_path / "f").write_text("mine")
    cli_fails(tmp_path, [*args, "--out", "f"], "f: is a file: expected " + expected)
    assert (tmp_path / "f").read_text() == "mine"


def test_a_handoff_bundle_over_a_file_says_what_was_expected(run_dir, tmp_path):
    (tmp_path / "f").write_text("mine")
    cli_fails(tmp_path, ["handoff", run_dir, "--out", "f"], "f: is a file: expected a new bundle directory")
    assert (tmp_path / "f").read_text() == "mine" and not (tmp_path / "f.tar.gz").exists()


@pytest.mark.parametrize(
    ("table", "column"), [("chunks", "seq"), ("chunks", "arrival_ns"), ("requests", "scheduled_ns")]
)
def test_a_null_in_a_column_loadgen_always_fills_names_the_file(run_dir, tmp_path, table, column):
    """Before: a null seq or arrival_ns in chunks was a ValueError / numpy casting traceback in analyze and
    compare; a null scheduled_ns was read as NaN and analysed. The schema says not null: one line now."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(run_dir, tmp_path / "run")
    (part,) = sorted((tmp_path / "run" / f"{table}.parquet").glob("*.parquet"))
    data = pq.read_table(part)
    i = data.column_names.index(column)
    kind = data.schema.field(i).type
    data = data.set_column(i, pa.field(column, kind, nullable=True), pa.nulls(data.num_rows, kind))
    pq.write_table(data.replace_schema_metadata(data.schema.metadata), part)
    expected = f"{column} = null ({data.num_rows} row(s)): expected a value in every row"
    cli_fails(tmp_path, ["analyze", "run"], f"{table}.parquet", expected)


@pytest.mark.parametrize(("kind", "expected"), [("azure", "an Azure LLM"), ("mooncake", "a Mooncake trace JSONL")])
def test_an_import_source_that_is_not_utf8_is_one_line(tmp_path, kind, expected):
    """Before: a UnicodeDecodeError traceback (the readers caught OSError only; mooncake decoded line by line)."""
    (tmp_path / "src").write_bytes(b"\xff\xfe abc\n")
    cli_fails(tmp_path, ["trace", "import", kind, "src", "--out", "t.parquet"], "src: not UTF-8 (byte 0)", expected)
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--trace", "bad.parquet"], "bad.parquet: unreadable Parquet"),
        (["--scenario", "bad.toml"], "bad.toml: invalid TOML"),
        (["--window-s", "0.001"], "no request in the first 0.001 s"),
    ],
)
def test_practice_reads_its_scenario_and_trace_before_making_its_directory(tmp_path, args, expected):
    """Before: --out was made first, and left behind (empty) by a refused scenario or trace."""
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    (tmp_path / "bad.toml").write_bytes(b"\xff")
    cli_fails(tmp_path, ["practice", *args, "--out", "p"], expected)
    assert not (tmp_path / "p").exists()
