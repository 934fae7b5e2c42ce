"""Hostile and absurd inputs (issue 12): each is one ``loadgen: error:`` line naming file/field/value, exit 2.

Run in-process through ``loadgen.cli.main`` (the same code path as the command, without a process per case);
``test_fuzz_cli.py`` drives the real command in subprocesses with mutated files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadgen.cli import main
from loadgen.plan.prices import load_prices
from loadgen.rundir.io import run_table_files
from loadgen.rundir.schema import CHUNKS_FILE, REQUESTS_FILE
from loadgen.trace.io import TRACE_METADATA_KEY, read_trace
from loadgen.util.errors import ScenarioError

REPO = Path(__file__).resolve().parents[1]
CANONICAL = (REPO / "scenarios" / "canonical.toml").read_text()
INSTANT = (REPO / "scenarios" / "engines" / "instant.toml").read_text()
LLAMA = json.loads((REPO / "loadgen" / "data" / "models" / "llama-3.1-8b.json").read_text())


def fails(capsys: pytest.CaptureFixture[str], args: list[str], *expected: str) -> str:
    """Run the command; it must exit 2 with exactly one stderr line containing every ``expected``."""
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("loadgen: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err
    return err


def parser_fails(capsys: pytest.CaptureFixture[str], args: list[str], *expected: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("loadgen: error: ") and err.count("\n") == 1, err
    for text in expected:
        assert text in err, err


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "ok.parquet"
    assert (
        main(["trace", "generate", str(REPO / "scenarios" / "canonical.toml"), "--trace", "steady", "--out", str(path)])
        == 0
    )
    return path


# ---- scenario numbers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("rate_rps = 4.0", "rate_rps = 1e308", "traces.steady.rate_rps = 1e+308"),
        ("rate_rps = 4.0", "rate_rps = inf", "traces.steady.rate_rps = inf"),
        ("rate_rps = 4.0", "rate_rps = nan", "traces.steady.rate_rps = nan"),
        ("rate_rps = 4.0", "rate_rps = 1e9", "traces.steady.rate_rps = 1000000000.0"),
        ("mean = 160,", "mean = 1e308,", "classes.short-message.input_tokens.mean = 1e+308"),
        ("mean = 160, sigma = 0.6, min = 8, max = 1024", "mean = 2e6, sigma = 0.6", "input_tokens = 2e+06"),
        ("seed = 20261129", "seed = -1", "seed = -1"),
        ("max_in_flight = 256", "max_in_flight = -1", "max_in_flight = -1"),
        ("ttft_timeout_s = 30", "ttft_timeout_s = inf", "errors.ttft_timeout_s = inf"),
        ("low = 2, high = 6 }", "low = 2, high = 6e9 }", "thread.turns = 6e+09"),
    ],
)
def test_scenario_numbers_are_finite_and_bounded(tmp_path, capsys, old, new, expected):
    path = tmp_path / "s.toml"
    assert old in CANONICAL
    path.write_text(CANONICAL.replace(old, new, 1))
    fails(capsys, ["scenario", "check", path], str(path), expected)
    fails(capsys, ["trace", "generate", path, "--trace", "steady", "--out", tmp_path / "t.parquet"])
    assert not (tmp_path / "t.parquet").exists()


def test_a_rate_times_duration_beyond_the_trace_bound_is_refused(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(CANONICAL.replace("rate_rps = 4.0\nduration_s = 60", "rate_rps = 1e5\nduration_s = 604800", 1))
    fails(capsys, ["scenario", "check", path], "traces.steady", "requests: expected at most")


def test_sampled_tails_and_thread_context_beyond_the_token_bound(tmp_path, capsys):
    path = tmp_path / "tail.toml"
    path.write_text(
        CANONICAL.replace(
            'output_tokens = { dist = "lognormal", mean = 200, sigma = 0.5, min = 16, max = 1024 }',
            'output_tokens = { dist = "normal", mean = 20000, std = 1e9 }',
            1,
        )
    )
    fails(
        capsys,
        ["trace", "generate", path, "--trace", "steady", "--out", tmp_path / "t.parquet"],
        "classes.long-thread.output_tokens: sampled",
    )
    path.write_text(
        CANONICAL.replace(
            'output_tokens = { dist = "lognormal", mean = 200, sigma = 0.5, min = 16, max = 1024 }',
            'output_tokens = { dist = "fixed", value = 900000 }',
            1,
        )
    )
    fails(
        capsys,
        ["trace", "generate", path, "--trace", "steady", "--out", tmp_path / "t.parquet"],
        "thread context",
        "1048576",
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["trace", "generate", "s.toml", "--trace", "steady", "--out", "o.parquet", "--seed", "-1"],
            "argument --seed: -1",
        ),
        (["trace", "import", "azure", "x.csv", "--out", "o.parquet", "--time-scale", "nan"], "--time-scale: nan"),
        (["trace", "import", "azure", "x.csv", "--out", "o.parquet", "--duration-s", "inf"], "--duration-s: inf"),
        (["ledger", "--model", "llama-3.1-8b", "--kv-cache-gib", "nan"], "--kv-cache-gib: nan"),
        (["ledger", "--model", "llama-3.1-8b", "--kv-cache-gib", "inf"], "--kv-cache-gib: inf"),
        (["ledger", "--model", "llama-3.1-8b", "--block-size", "0"], "--block-size: 0"),
        (["sim", "serve", "--engine", "instant", "--port", "70000"], "--port: 70000"),
        (["sim", "serve", "--engine", "instant", "--port", "-1"], "--port: -1"),
        (
            ["run", "t.parquet", "--target", "http://x", "--out", "o", "--max-concurrency", "-1"],
            "--max-concurrency: -1",
        ),
        (
            ["run", "t.parquet", "--target", "http://x", "--out", "o", "--ttft-timeout-s", "nan"],
            "--ttft-timeout-s: nan",
        ),
        (["practice", "--window-s", "inf"], "--window-s: inf"),
    ],
)
def test_numeric_flags_are_checked_before_any_work(capsys, args, expected):
    parser_fails(capsys, args, expected)


# ---- traces --------------------------------------------------------------------------------------------


def _rewrite(src: Path, dst: Path, columns: dict[str, list] | None = None, meta: bytes | None = None) -> Path:
    table, metadata = read_trace(src)
    data = table.to_pydict()
    data.update(columns or {})
    out = pa.table(data)
    raw = meta if meta is not None else json.dumps(metadata).encode()
    pq.write_table(out.replace_schema_metadata({TRACE_METADATA_KEY: raw}), dst)
    return dst


def _trace_cases(src: Path, tmp: Path) -> list[tuple[Path, str]]:
    table, meta = read_trace(src)
    n = table.num_rows
    offsets = table.column("scheduled_offset_ns").to_pylist()
    prompts = table.column("prompt_tokens").to_pylist()
    return [
        (_rewrite(src, tmp / "nulls.parquet", {"prompt_tokens": [None] + prompts[1:]}), "prompt_tokens = null (row 0)"),
        (_rewrite(src, tmp / "strings.parquet", {"output_tokens": ["x"] * n}), "column output_tokens of type string"),
        (
            _rewrite(
                src, tmp / "nan.parquet", {"scheduled_offset_ns": [float("nan")] + [float(x) for x in offsets[1:]]}
            ),
            "column scheduled_offset_ns of type double",
        ),
        (_rewrite(src, tmp / "list-meta.parquet", meta=b"[1, 2]"), "is a JSON list: expected a JSON object"),
        (_rewrite(src, tmp / "bytes-meta.parquet", meta=b"\xff\xfe"), "not UTF-8 JSON"),
        (
            _rewrite(src, tmp / "mif.parquet", meta=json.dumps({**meta, "max_in_flight": -1}).encode()),
            "max_in_flight = -1",
        ),
        (
            _rewrite(src, tmp / "late.parquet", {"scheduled_offset_ns": offsets[:-1] + [2**63 - 10]}),
            "scheduled_offset_ns = 9223372036854775798",
        ),
        (
            _rewrite(src, tmp / "huge.parquet", {"prompt_tokens": [2147483647] + prompts[1:]}),
            "prompt_tokens = 2147483647 (row 0)",
        ),
        (_rewrite(src, tmp / "negative.parquet", {"output_tokens": [-5] + prompts[1:]}), "output_tokens = -5"),
        (_rewrite(src, tmp / "dup.parquet", {"request_id": ["r1"] * n}), "request_id = 'r1' appears more than once"),
    ]


def test_malformed_traces_are_one_line_in_every_command_that_reads_them(tmp_path, capsys, trace):
    for path, expected in _trace_cases(trace, tmp_path):
        fails(capsys, ["trace", "stats", path], str(path), expected)
        fails(capsys, ["sim", "run", path, "--engine", "instant", "--out", tmp_path / "sim-out"], expected)
        fails(capsys, ["run", path, "--target", "http://127.0.0.1:9", "--out", tmp_path / "run-out"], expected)
        assert not (tmp_path / "sim-out").exists() and not (tmp_path / "run-out").exists()


def test_azure_import_refuses_wrapping_and_negative_counts(tmp_path, capsys):
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    cases = {
        "wrap.csv": ("2023-11-16 18:17:03.9799600,99999999999,10\n", "ContextTokens = 99999999999"),
        "negative.csv": ("2023-11-16 18:17:03.9799600,100,-5\n", "GeneratedTokens = -5"),
        "year.csv": ("0001-01-01 00:00:00,100,5\n", "expected a time between 1970"),
    }
    for name, (row, expected) in cases.items():
        (tmp_path / name).write_text(head + row)
        fails(capsys, ["trace", "import", "azure", tmp_path / name, "--out", tmp_path / "o.parquet"], expected)
    (tmp_path / "mc.jsonl").write_text('{"timestamp": 1e400, "input_length": 5, "output_length": 3}\n')
    fails(
        capsys,
        ["trace", "import", "mooncake", tmp_path / "mc.jsonl", "--out", tmp_path / "o.parquet"],
        "timestamp = inf",
    )
    assert not (tmp_path / "o.parquet").exists()


# ---- engine configs, ledger, manifests, plans ----------------------------------------------------------


def test_engine_configs_refuse_infinite_costs_and_empty_error_statuses(tmp_path, capsys):
    inf = tmp_path / "inf.toml"
    inf.write_text(INSTANT.replace("fixed_ms = 0.0", "fixed_ms = inf"))
    fails(capsys, ["sim", "serve", "--engine", inf, "--port", "0"], "cost.fixed_ms = inf")
    statuses = tmp_path / "statuses.toml"
    statuses.write_text(
        INSTANT.replace("error_rate = 0.0", "error_rate = 1").replace(
            "error_statuses = [500, 503]", "error_statuses = []"
        )
    )
    fails(capsys, ["sim", "serve", "--engine", statuses, "--port", "0"], "faults.error_statuses = []")


@pytest.mark.parametrize(
    ("source", "old", "new", "command", "expected"),
    [
        (
            "canonical.toml",
            "p50 = 300, p99 = 1500",
            "p50 = 300, p99 = true",
            ["scenario", "check"],
            "ttft_ms.p99 = True",
        ),
        (
            "engines/instant.toml",
            "max_num_seqs = 1024",
            "max_num_seqs = true",
            ["sim", "serve", "--port", "0", "--engine"],
            "scheduler.max_num_seqs = True",
        ),
        (
            "contract/canonical.toml",
            "max_words = 20 }",
            "max_words = true }",
            ["contract", "check"],
            "max_words = True",
        ),
        (
            "prices.toml",
            "usd_per_hour = 2.50",
            "usd_per_hour = true",
            None,  # read by compare and managed after their run directories: here through its loader
            "usd_per_hour = True",
        ),
    ],
)
def test_a_boolean_is_not_taken_as_a_number(tmp_path, capsys, source, old, new, command, expected):
    """``p99 = true`` is a mistake, not a 1 ms budget (pydantic alone takes a boolean as 0 or 1): every file
    loadgen reads through a model refuses it (``loadgen.util.limits.InputModel``)."""
    text = (REPO / "scenarios" / source).read_text()
    assert old in text
    path = tmp_path / Path(source).name
    path.write_text(text.replace(old, new, 1))
    if command is None:
        with pytest.raises(ScenarioError) as caught:
            load_prices(path)
        assert str(path) in str(caught.value) and f"{expected}: expected a number, got the boolean true" in str(
            caught.value
        )
        return
    fails(capsys, [*command, path], str(path), expected, "expected a number, got the boolean true")


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("concurrency = [8, 64]", "concurrency = [8, true]", "concurrency[1] = True"),
        ("rates_rps = [1, 2, 4, 8, 16]", "rates_rps = [true, 2, 4, 8, 16]", "rates_rps[0] = True"),
    ],
)
def test_a_boolean_in_a_list_of_numbers_is_not_taken_as_one(tmp_path, capsys, old, new, expected):
    """``concurrency = [8, true]`` ran a cell at concurrency 1: the boolean guard looked at a field's own value,
    never at a list's items."""
    text = (REPO / "scenarios" / "plans" / "quick.toml").read_text()
    assert old in text
    text = text.replace(old, new, 1).replace('"../canonical.toml"', f'"{REPO / "scenarios" / "canonical.toml"}"')
    path = tmp_path / "quick.toml"
    path.write_text(text)
    out = tmp_path / "plan"
    fails(
        capsys, ["plan", path, "--sim-worksheet", "instant", "--out", out], str(path), expected, "got the boolean true"
    )
    assert not out.exists()


def test_ledger_refuses_bad_configs(tmp_path, capsys):
    (tmp_path / "bytes.json").write_bytes(b'{"hidden_size": "\xff"}')
    fails(capsys, ["ledger", "--model", tmp_path / "bytes.json"], "not UTF-8")
    (tmp_path / "float.json").write_text(json.dumps({**LLAMA, "num_hidden_layers": 1e30}))
    fails(capsys, ["ledger", "--model", tmp_path / "float.json"], "num_hidden_layers = 1e+30")
    (tmp_path / "big.json").write_text(
        json.dumps(LLAMA).replace('"num_hidden_layers": 32', '"num_hidden_layers": ' + "9" * 30)
    )
    fails(capsys, ["ledger", "--model", tmp_path / "big.json"], "num_hidden_layers = 999")
    (tmp_path / "deep.json").write_text("[" * 100_000)
    fails(capsys, ["ledger", "--model", tmp_path / "deep.json"], "nested too deeply")


@pytest.fixture
def run_dir(tmp_path: Path, trace: Path) -> Path:
    out = tmp_path / "run"
    assert main(["sim", "run", str(trace), "--engine", "instant", "--out", str(out)]) == 0
    return out


def test_damaged_manifests_and_emptied_requests(tmp_path, capsys, run_dir):
    manifest = run_dir / "manifest.json"
    good = manifest.read_bytes()
    for raw, expected in (
        (b"[1, 2]", "top level is a JSON array"),
        (b'{"a": "\xff"}', "not UTF-8"),
        (b'{"a": ', "invalid JSON"),
    ):
        manifest.write_bytes(raw)
        fails(capsys, ["analyze", run_dir], "manifest.json", expected)
        fails(capsys, ["compare", run_dir, run_dir])
    manifest.write_bytes(good)
    (part,) = run_table_files(run_dir, REQUESTS_FILE)  # a closed run: one part file per table
    table = pq.read_table(part)
    pq.write_table(table.slice(0, 0), part)
    recorded = json.loads(good)["requests_recorded"]
    fails(capsys, ["analyze", run_dir], f"0 rows: expected {recorded}")
    pq.write_table(table.slice(0, 3), part)
    assert main(["analyze", str(run_dir), "--quiet", "--json", str(tmp_path / "a.json")]) == 0
    capsys.readouterr()
    notes = json.loads((tmp_path / "a.json").read_text())["notes"]
    assert any(f"holds 3 of the {recorded}" in note for note in notes)
    fails(capsys, ["analyze", run_dir, "--window", "nan:inf"], "finite")


def test_a_corrupt_chunk_page_names_its_file(tmp_path, capsys, run_dir):
    """A data page that fails to decode (bit rot inside a part file whose footer is intact) is one line naming
    the file, raised from the reader thread that decodes ahead of the pass."""
    (part,) = run_table_files(run_dir, CHUNKS_FILE)
    table = pq.read_table(part)
    pq.write_table(table, part, compression="zstd")
    raw = bytearray(part.read_bytes())
    footer = int.from_bytes(raw[-8:-4], "little") + 8  # footer length + "PAR1" + the length itself
    for i in range(64, len(raw) - footer, 3):  # the pages: every third byte flipped, the footer intact
        raw[i] ^= 0xFF
    part.write_bytes(bytes(raw))
    fails(capsys, ["analyze", run_dir], str(part), "unreadable Parquet")


def test_plans_refuse_absurd_durations_and_damaged_state(tmp_path, capsys):
    scenario = tmp_path / "canonical.toml"
    scenario.write_text(CANONICAL)
    quick = (REPO / "scenarios" / "plans" / "quick.toml").read_text().replace('"../canonical.toml"', '"canonical.toml"')
    plan = tmp_path / "p.toml"
    plan.write_text(quick.replace("duration_s = 10", "duration_s = 1e308"))
    fails(capsys, ["plan", plan, "--sim-worksheet", "instant", "--out", tmp_path / "out"], "duration_s = 1e+308")
    plan.write_text(quick.replace("duration_s = 10", "duration_s = 2").replace("repeats = 2", "repeats = 1"))
    assert main(
        ["plan", str(plan), "--sim-worksheet", "instant", "--out", str(tmp_path / "out"), "--max-runs", "1", "--quiet"]
    ) in (0, 3)
    capsys.readouterr()
    state = tmp_path / "out" / "plan.json"
    good = state.read_text()
    for text, expected in (
        (good[:100], "invalid JSON"),
        ("[]", "top level is a JSON array"),
        (json.dumps({**json.loads(good), "target": [1]}), "target = [1]: expected"),
    ):
        state.write_text(text)
        fails(capsys, ["plan", plan, "--sim-worksheet", "instant", "--out", tmp_path / "out"], "plan.json", expected)


def test_a_file_name_with_a_nul_byte_is_one_line(tmp_path, capsys):
    # found by the fuzz test: a plan's scenario path "a\u0000b" ended in a ValueError traceback
    quick = (REPO / "scenarios" / "plans" / "quick.toml").read_text()
    plan = tmp_path / "p.toml"
    plan.write_text(quick.replace('"../canonical.toml"', '"canon\\u0000ical.toml"'))
    fails(capsys, ["plan", plan, "--sim-worksheet", "instant", "--out", tmp_path / "out"], "NUL byte")


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ("[calibration]\ncalibrated = true\nvalidated_error = 5\n", "calibration.validated_error = 5: expected"),
        (
            "[calibration]\ncalibrated = true\n[calibration.memory]\nruntime_gib = 'x'\n",
            "calibration.memory.runtime_gib",
        ),
        (
            "[calibration]\ncalibrated = true\n[calibration.memory]\nruntime_gib = 2000\n",
            "runtime_gib = 2000: expected",
        ),
        (
            "[calibration.measured_validations.r]\nrun_dir = 'r'\nanchor = 'workload'\nmpe_pct = nan\nmape_pct = 1.0\n",
            "calibration.measured_validations.r.mpe_pct = nan: expected",
        ),
        ("[behavior]\nbogus = 1\n", "behavior.bogus = 1: unknown field"),
    ],
)
def test_an_engine_toml_with_a_broken_table_is_refused_when_it_loads(tmp_path, capsys, table, expected):
    """``[calibration]`` was an unchecked mapping: ``validated_error = 5`` printed "calibrated against ? on ?
    ... validated error 5" and a bad ``runtime_gib`` met only the ledger; ``[behavior]``'s error named no table."""
    engine = tmp_path / "engine.toml"
    engine.write_text((REPO / "scenarios" / "engines" / "instant.toml").read_text() + "\n" + table)
    trace = tmp_path / "steady.parquet"
    assert (
        main(
            ["trace", "generate", str(REPO / "scenarios" / "canonical.toml"), "--trace", "steady", "--out", str(trace)]
        )
        == 0
    )
    capsys.readouterr()
    out = tmp_path / "run"
    fails(capsys, ["sim", "run", "--engine", engine, "--out", out, trace], str(engine), expected)
    assert not out.exists()
