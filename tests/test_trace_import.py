"""Importers against the real public traces in ../shared/traces: figures match SOURCES.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from shared_paths import shared_trace

from loadgen.trace import read_trace, trace_stats
from loadgen.trace.importers import import_trace
from loadgen.util.errors import TraceError


@pytest.mark.parametrize(
    "kind,rel,rows,duration,rate,iat_cv,iod,p_in,p_out",
    [
        # from ../shared/traces/SOURCES.md ("Statistics of the copied traces")
        (
            "azure",
            "azure2023/AzureLLMInferenceTrace_code.csv",
            8819,
            3435.9,
            2.567,
            13.15,
            (13.2, 71.6, 164),
            (1469, 7303, 7436),
            (13, 90, 251.5),
        ),
        (
            "azure",
            "azure2023/AzureLLMInferenceTrace_conv.csv",
            19366,
            3501.7,
            5.530,
            1.09,
            (1.39, 3.86, 16.1),
            (1020, 4083, 4142),
            (129, 451, 601),
        ),
        (
            "mooncake",
            "mooncake_fast25/conversation_trace.jsonl",
            12031,
            3537.0,
            3.401,
            3.03,
            (7.9, 2.1, 2.9),
            (6909, 39551, 85400),
            (350, 698, 1119),
        ),
        (
            "mooncake",
            "mooncake_fast25/synthetic_trace.jsonl",
            3993,
            1022.0,
            3.907,
            1.01,
            (1.09, 1.18, 1.19),
            (11587, 48905, 66456),
            (69, 519, 768),
        ),
    ],
)
def test_imported_traces_reproduce_published_statistics(
    tmp_path, kind, rel, rows, duration, rate, iat_cv, iod, p_in, p_out
):
    out = import_trace(kind, shared_trace(rel), tmp_path / "t.parquet")
    table, meta = read_trace(out)
    stats = trace_stats(table)
    assert stats.requests == rows
    assert stats.duration_s == pytest.approx(duration, abs=0.05)
    assert stats.mean_rate_rps == pytest.approx(rate, abs=0.001)
    assert stats.iat_cv == pytest.approx(iat_cv, rel=0.005)
    for window, expected in zip(("1s", "10s", "60s"), iod):
        assert stats.iod[window] == pytest.approx(expected, rel=0.02, abs=0.01)
    for q, expected in zip(("p50", "p95", "p99"), p_in):
        assert stats.prompt_tokens[q] == pytest.approx(expected, abs=0.6)
    for q, expected in zip(("p50", "p95", "p99"), p_out):
        assert stats.output_tokens[q] == pytest.approx(expected, abs=0.6)
    assert len(meta["source_sha256"]) == 64


def test_mooncake_hash_blocks_become_shared_prefix_groups(tmp_path):
    out = import_trace("mooncake", shared_trace("mooncake_fast25/synthetic_trace.jsonl"), tmp_path / "t.parquet")
    rows = read_trace(out)[0].to_pylist()
    grouped = [r for r in rows if r["prefix_group"]]
    assert grouped
    assert all(r["prefix_tokens"] % 512 == 0 or r["prefix_tokens"] == r["prompt_tokens"] - 1 for r in grouped)
    assert all(r["prefix_tokens"] < r["prompt_tokens"] for r in grouped)


def test_window_and_time_scale(tmp_path):
    src = shared_trace("azure2023/AzureLLMInferenceTrace_conv.csv")
    full = trace_stats(read_trace(import_trace("azure", src, tmp_path / "a.parquet"))[0])
    cut = read_trace(import_trace("azure", src, tmp_path / "b.parquet", start_s=600, duration_s=300, time_scale=0.5))[0]
    stats = trace_stats(cut)
    assert stats.duration_s <= 150.0 + 1e-6  # 300 s window at twice the speed
    assert stats.mean_rate_rps == pytest.approx(2 * stats.requests / 300, rel=0.05)
    assert stats.requests < full.requests


def test_bad_input_files_give_one_line_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.97,12,x\r\n")
    with pytest.raises(TraceError, match=r"row 2: GeneratedTokens = 'x': expected an integer"):
        import_trace("azure", bad, tmp_path / "o.parquet")
    header = tmp_path / "h.csv"
    header.write_text("a,b\n")
    with pytest.raises(TraceError, match="header"):
        import_trace("azure", header, tmp_path / "o.parquet")
    jl = tmp_path / "m.jsonl"
    jl.write_text('{"timestamp": 0, "input_length": 5}\n')
    with pytest.raises(TraceError, match="line 1: missing field 'output_length'"):
        import_trace("mooncake", jl, tmp_path / "o.parquet")


def test_cli_import_and_stats(tmp_path):
    src = shared_trace("azure2023/AzureLLMInferenceTrace_code.csv")
    out = tmp_path / "code.parquet"
    res = subprocess.run(
        [sys.executable, "-m", "loadgen", "trace", "import", "azure", str(src), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    res = subprocess.run([sys.executable, "-m", "loadgen", "trace", "stats", str(out)], capture_output=True, text=True)
    assert res.returncode == 0
    assert "requests 8,819" in res.stdout and "IAT CV 13.15" in res.stdout


_MOONCAKE = {"timestamp": 0, "input_length": 1030, "output_length": 5, "hash_ids": [0, 1, 2]}
_WORKLOAD = {"input_toks": 3, "output_toks": 5, "arrival_time_ns": 0, "input_tok_ids": [7, 8, 9]}


@pytest.mark.parametrize(
    ("kind", "record", "needle"),
    [
        ("mooncake", _MOONCAKE | {"input_length": True}, "line 1: input_length = True: expected an integer"),
        ("mooncake", _MOONCAKE | {"output_length": False}, "line 1: output_length = False: expected an integer"),
        ("mooncake", _MOONCAKE | {"hash_ids": None}, "line 1: hash_ids = None: expected a list of one id per"),
        ("mooncake", _MOONCAKE | {"hash_ids": 5}, "line 1: hash_ids = 5: expected a list"),
        ("mooncake", _MOONCAKE | {"hash_ids": [0]}, "line 1: hash_ids = 1 ids: expected a list of one id per"),
        ("mooncake", [_MOONCAKE], "line 1: a JSON list: expected a Mooncake record"),
        ("llmservingsim", _WORKLOAD | {"output_toks": True}, "line 1: output_toks = True: expected an integer"),
        ("llmservingsim", _WORKLOAD | {"input_toks": True}, "line 1: input_toks = True: expected an integer"),
    ],
)
def test_a_wrong_field_is_refused_in_one_line_naming_it(tmp_path, kind, record, needle):
    """A boolean count (int(True) is 1), a hash_ids that is no list or holds another number of blocks than
    input_length needs: one line naming the file and field, exit 2, no trace written."""
    src, out = tmp_path / "in.jsonl", tmp_path / "t.parquet"
    src.write_text(json.dumps(record) + "\n" + json.dumps(_MOONCAKE if kind == "mooncake" else _WORKLOAD) + "\n")
    cmd = [sys.executable, "-m", "loadgen", "trace", "import", kind, str(src), "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    assert f"{src}: {needle}" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()
