"""vLLM ``bench serve --save-detailed`` results → run directory (hand-made file in vLLM's layout)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from loadgen.analysis import analyze_run
from loadgen.cli import main
from loadgen.rundir.foreign import import_vllm_bench
from loadgen.util.errors import RunDirError


def _result(**over):
    data = {
        "date": "20250101-000000",
        "backend": "vllm",
        "model_id": "tiny",
        "tokenizer_id": "tiny",
        "num_prompts": 3,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 2,
        "duration": 1.0,
        "completed": 2,
        "failed": 1,
        "total_input_tokens": 22,
        "total_output_tokens": 7,
        "input_lens": [10, 12, 11],
        "output_lens": [3, 4, 0],
        "ttfts": [0.05, 0.08, 0.0],
        "itls": [[0.01, 0.02], [0.01, 0.01, 0.03], []],
        "latencies": [0.08, 0.14, 0.0],
        "start_times": [100.0, 100.01, 100.02],
        "queue_times": [0.0, 0.005, 0.0],
        "generated_texts": ["a b c", "d e f g", ""],
        "errors": ["", "", "Bad Request: HTTP status 400 (prompt too long)"],
    }
    data.update(over)
    return data


def test_vllm_detailed_result_known_answers(tmp_path):
    src = tmp_path / "vllm-inf-qps.json"
    src.write_text(json.dumps(_result()))
    assert main(["import", "vllm", str(src), "--out", str(tmp_path / "run")]) == 0
    a = analyze_run(tmp_path / "run")
    m = a.overall.metrics
    # r1 was scheduled 5 ms before it was sent (client queue); vLLM's TTFT is from the send
    assert m["server_ttft_ms"]["mean"] == pytest.approx(65)  # what vLLM prints as mean TTFT
    assert sorted([m["ttft_ms"]["p50"] - 0, m["ttft_ms"]["max"]]) == [pytest.approx(67.5), pytest.approx(85)]
    assert m["client_queue_ms"]["max"] == pytest.approx(5)
    flat = [x * 1000 for r in _result()["itls"] for x in r]
    assert m["itl_ms"]["n"] == len(flat) and m["itl_ms"]["mean"] == pytest.approx(np.mean(flat))
    assert m["itl_ms"]["p50"] == pytest.approx(np.percentile(flat, 50))
    assert m["e2e_ms"]["max"] == pytest.approx(145)  # done 150 ms − scheduled 5 ms
    assert a.overall.status_counts["error"] == 1 and a.overall.error_kinds == {"http_4xx": 1}
    assert a.rates_meaningful  # start_times are real send instants
    chunks = pq.read_table(tmp_path / "run" / "chunks.parquet").to_pandas()
    assert len(chunks) == 7 and set(chunks.tokens) == {1}


def test_vllm_without_start_times_is_synthesized_and_uneven_tokens_noted(tmp_path):
    data = _result(output_lens=[6, 4, 0])
    for key in ("start_times", "queue_times", "latencies"):
        data.pop(key)
    src = tmp_path / "old.json"
    src.write_text(json.dumps(data))
    run = import_vllm_bench(src, tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["synthesized"]["timing"] is True
    assert any("spread evenly" in n for n in manifest["synthesized"]["notes"])
    a = analyze_run(run)
    assert not a.rates_meaningful and not a.stability["applied"]
    # 6 tokens over 3 chunks: 2 per chunk → first chunk 1 zero gap, then 2×5 ms and 2×10 ms
    chunks = pq.read_table(run / "chunks.parquet").to_pandas()
    assert list(chunks[chunks.request_id.str.endswith("00000")].tokens) == [2, 2, 2]


def test_vllm_bad_file(tmp_path):
    src = tmp_path / "x.json"
    src.write_text(json.dumps({"duration": 1}))
    with pytest.raises(RunDirError, match="--save-detailed"):
        import_vllm_bench(src, tmp_path / "run")


@pytest.mark.parametrize(
    ("change", "said"),
    [  # each was a traceback (OverflowError), a run that analyze then refused, or a process killed for memory
        ({"latencies": [1e300, 0.14, 0.0]}, "latencies[0] = 1e+300: expected input should be less than or equal to"),
        ({"duration": 1e300}, "duration = 1e+300: expected"),  # was "manifest update: ..." and a half-made run
        ({"start_times": [-1e300, 100.01, 100.02]}, "start_times span 1e+300 s: expected at most a year"),
        ({"start_times": [1e9, 1e9 + 1e7, 1e9]}, "record 1 (r-00001): scheduled_ns = 9999999995000004: expected an"),
        ({"ttfts": [5.0, 0.08, 0.0]}, "record 0 (r-00000): done_ns = 80000000 is before first_token_ns = 5000000000"),
        ({"input_lens": [10**30, 12, 11]}, "input_lens[0] = 1000000000000000000000000000000: expected"),
        ({"max_concurrency": 10**30}, "max_concurrency = 1000000000000000000000000000000: expected"),
    ],
)
def test_a_result_no_run_can_hold_is_one_line_and_writes_nothing(tmp_path, change, said):
    src = tmp_path / "r.json"
    src.write_text(json.dumps(_result(**change)))
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "import", "vllm", str(src), "--out", str(out)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{src}: {said}" in proc.stderr
    assert not out.exists()


def test_a_concurrency_far_above_the_requests_places_them_without_a_slot_each(tmp_path):
    """No start_times and max_concurrency 10^6: the slots were made first, one per concurrency (a million);
    now at most one per request, the same placement."""
    data = _result(max_concurrency=1_000_000)
    for key in ("start_times", "queue_times"):
        data.pop(key)
    src = tmp_path / "r.json"
    src.write_text(json.dumps(data))
    a = analyze_run(import_vllm_bench(src, tmp_path / "run"))
    assert a.overall.status_counts["ok"] == 2


VLLM_BENCH = (
    "import sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n"
)


@pytest.mark.vllm
@pytest.mark.slow
def test_real_vllm_bench_serve_result_reproduced(tmp_path):
    """Golden data from vLLM itself: ``vllm bench serve --save-detailed`` against the simulated engine,
    imported and analysed, gives vLLM's own TTFT and ITL statistics (needs LOADGEN_VLLM_PYTHON)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    vpy = os.environ.get("LOADGEN_VLLM_PYTHON")
    if not vpy or not Path(vpy).exists():
        pytest.skip("env LOADGEN_VLLM_PYTHON is unset or missing: no vLLM to produce a result file")
    from loadgen.vllm import make_model_dir

    model = make_model_dir(None, tmp_path / "model")
    sim = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "sim", "serve", "--engine", "instant", "--port", "0"],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = sim.stdout.readline()
        url = line.split("listening on", 1)[1].strip()
        bench = subprocess.run(
            [
                vpy,
                "-c",
                VLLM_BENCH,
                "--backend",
                "openai",
                "--base-url",
                url,
                "--model",
                "loadgen-sim",
                "--dataset-name",
                "random",
                "--random-input-len",
                "32",
                "--random-output-len",
                "16",
                "--num-prompts",
                "60",
                "--request-rate",
                "30",
                "--max-concurrency",
                "8",
                "--tokenizer",
                str(model),
                "--ignore-eos",
                "--save-result",
                "--save-detailed",
                "--result-dir",
                str(tmp_path),
                "--result-filename",
                "vb.json",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert (tmp_path / "vb.json").exists(), bench.stdout[-3000:] + bench.stderr[-3000:]
    finally:
        sim.terminate()
        sim.wait(timeout=30)
    published = json.loads((tmp_path / "vb.json").read_text())
    a = analyze_run(import_vllm_bench(tmp_path / "vb.json", tmp_path / "run"))
    m = a.overall.metrics
    close = {"rel": 1e-6, "abs": 1e-6}  # instants are whole ns
    assert m["server_ttft_ms"]["mean"] == pytest.approx(published["mean_ttft_ms"], **close)
    assert m["server_ttft_ms"]["p50"] == pytest.approx(published["median_ttft_ms"], **close)
    assert m["server_ttft_ms"]["p99"] == pytest.approx(published["p99_ttft_ms"], **close)
    assert m["itl_ms"]["mean"] == pytest.approx(published["mean_itl_ms"], **close)
    assert m["itl_ms"]["p50"] == pytest.approx(published["median_itl_ms"], **close)
    assert m["itl_ms"]["p99"] == pytest.approx(published["p99_itl_ms"], **close)
    assert a.overall.status_counts["ok"] == published["completed"]
    assert a.overall.status_counts["error"] == published["failed"]
    assert a.rates_meaningful and m["client_queue_ms"]["n"] == published["completed"]


def test_a_first_request_that_queued_is_scheduled_at_the_runs_zero_not_before_it(tmp_path):
    """The run's zero is the earliest scheduled instant: a first request with a client queue time was written
    at a negative scheduled_ns (before the anchor) when the zero was the first send."""
    src = tmp_path / "queued.json"
    src.write_text(json.dumps(_result(queue_times=[0.005, 0.0, 0.0])))
    run = import_vllm_bench(src, tmp_path / "run")
    rows = pq.read_table(run / "requests.parquet").to_pandas().sort_values("request_id")
    assert list(rows.scheduled_ns) == [0, 15_000_000, 25_000_000]
    assert list(rows.sent_ns - rows.scheduled_ns) == [5_000_000, 0, 0]  # each request's queue time, kept
    assert analyze_run(run).overall.metrics["client_queue_ms"]["max"] == pytest.approx(5)


@pytest.mark.parametrize(
    ("over", "said"),
    [
        ({"itls": [[0.01], [0.01]]}, "itls has 2 entries: expected one per request (3, as ttfts)"),
        ({"latencies": [0.08]}, "latencies has 1 entries: expected one per request (3"),
        ({"start_times": ["soon", 100.01, 100.02]}, "start_times[0] = 'soon': expected"),
        ({"queue_times": [0.0, "x", 0.0]}, "queue_times[1] = 'x': expected"),
        ({"ttfts": [0.05, -0.08, 0.0]}, "ttfts[1] = -0.08: expected"),
        ({"input_lens": [10, 12.5, 11]}, "input_lens[1] = 12.5: expected"),
        ({"output_lens": [3, True, 0]}, "output_lens[1] = True: expected a number, got the boolean true"),
        ({"itls": [[0.01, 0.02], 0.01, []]}, "itls[1] = 0.01: expected"),
        ({"duration": "long"}, "duration = 'long': expected"),
    ],
)
def test_a_broken_result_file_is_one_line_and_leaves_no_run(tmp_path, over, said):
    """Each was a traceback (IndexError, ValueError, TypeError) or silently read; now one line naming the file,
    the field and its value, exit 2, and no run directory begun."""
    src = tmp_path / "broken.json"
    src.write_text(json.dumps(_result(**over)))
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "import", "vllm", str(src), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"{src}: {said}" in proc.stderr
    assert not out.exists()
