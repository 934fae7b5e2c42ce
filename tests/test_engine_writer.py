"""``loadgen sim engine``: a profiled engine TOML written from an operator profile, read back before it is kept."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from loadgen.ledger import GIB, EngineSettings, compute_ledger, read_model_config
from loadgen.rundir.schema import TRACE_FULL_SCHEMA
from loadgen.sim import load_engine_config
from loadgen.sim.worksheet import simulate_trace

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "scenarios" / "engines" / "profiles"
PRO6000_LLAMA = PROFILES / "RTXPRO6000" / "meta-llama" / "Llama-3.1-8B" / "bf16"
LLAMA = PROFILES / "models" / "Llama-3.1-8B.json"


def _engine(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "loadgen", "sim", "engine", "--profile", str(PRO6000_LLAMA), "--model-config"]
    return subprocess.run([*cmd, str(LLAMA), "--out", str(out), *args], capture_output=True, text=True)


def _trace(n: int) -> pa.Table:
    cols = {
        "request_id": [f"r{i}" for i in range(n)],
        "request_class": ["c"] * n,
        "scheduled_offset_ns": [i * 50_000_000 for i in range(n)],
        "prompt_tokens": [300 + 40 * i for i in range(n)],
        "output_tokens": [60] * n,
    }
    return pa.Table.from_pydict(
        {f.name: cols.get(f.name, [None] * n) for f in TRACE_FULL_SCHEMA}, schema=TRACE_FULL_SCHEMA
    )


def test_an_engine_written_from_the_shipped_profile_replays_as_the_shipped_engine(tmp_path):
    shipped = load_engine_config(ROOT / "scenarios" / "engines" / "rtxpro6000-llama-3.1-8b-tp1.toml")
    out = tmp_path / "mine.toml"
    sched = shipped.scheduler
    res = _engine(
        out,
        *("--max-num-seqs", str(sched.max_num_seqs), "--max-num-batched-tokens", str(sched.max_num_batched_tokens)),
        *("--max-model-len", str(sched.max_model_len), "--num-kv-blocks", str(shipped.num_kv_blocks)),
    )
    assert res.returncode == 0, res.stderr
    assert "profiled (operator profile of NVIDIA RTX PRO 6000 Blackwell Server Edition, vLLM 0.19.0, TP 1" in res.stdout
    mine = load_engine_config(out)
    trace = _trace(12)
    ours = simulate_trace(trace, {"mode": "open"}, mine).requests_table
    theirs = simulate_trace(trace, {"mode": "open"}, shipped).requests_table
    for column in ("first_token_ns", "last_token_ns", "server_scheduled_ns"):
        assert ours.column(column).to_pylist() == theirs.column(column).to_pylist(), column


def test_the_pool_and_the_batch_limits_default_as_the_file_says(tmp_path):
    out = tmp_path / "defaults.toml"
    res = _engine(out, "--max-model-len", "32768")
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    # vLLM's defaults for a GPU of >= 70 GiB (the table's RTX PRO 6000), the ledger's pool for them
    assert "max_num_seqs = 1024  # default" in text and "max_num_batched_tokens = 8192  # default" in text
    assert (
        "max_model_len = 32768  # given" in text
        and 'gpu = "NVIDIA RTX PRO 6000 Blackwell Server Edition"  # profile' in text
    )
    settings = EngineSettings(
        device_memory_gib=101_976_440_832 / GIB,
        gpu_memory_utilization=0.9,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        max_model_len=32768,
        device_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
    )
    blocks = compute_ledger(read_model_config(LLAMA), settings).kv_cache_blocks
    assert f"num_kv_blocks = {blocks}  # ledger: 101,976,440,832 B device (logged: " in text
    assert load_engine_config(out).num_kv_blocks == blocks


def test_refusals_are_one_line_and_leave_no_file(tmp_path):
    cases = (
        (["--tp", "4"], "no tp4/ folder"),
        (["--ep", "2"], "--ep 2: no --num-kv-blocks"),
        (["--max-model-len", "10000000"], "vLLM refuses to start otherwise"),
        (["--profile", str(tmp_path / "nowhere")], "no such file: expected the profile's meta.yaml"),
        # refused as the file is read back: named as the file the user gave, not the partial one beside it
        (
            ["--max-num-seqs", "512", "--max-num-batched-tokens", "256"],
            f"{tmp_path / 'refused.toml'} (not written): scheduler.max_num_batched_tokens = 256: expected at least",
        ),
    )
    for args, said in cases:
        out = tmp_path / "refused.toml"
        res = _engine(out, *args)
        assert res.returncode == 2 and said in res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
        assert not list(tmp_path.iterdir()), args


def test_a_vllm_019_profile_takes_019s_defaults_on_a_large_gpu(tmp_path):
    """vLLM 0.19 has no 160 GiB tier (it came later, vllm-project/vllm#51726): on a 180 GiB device a 0.19
    profile's engine defaults to 8,192 tokens and 1,024 sequences, as 0.19 would; the ledger's 0.32 rule gives
    16,384."""
    out = tmp_path / "big.toml"
    res = _engine(out, "--max-model-len", "32768", "--device-memory-bytes", str(180 * 2**30))
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "max_num_batched_tokens = 8192  # default" in text and "max_num_seqs = 1024  # default" in text


def test_an_out_that_is_a_folder_is_refused_by_its_own_name(tmp_path):
    folder = tmp_path / "engines"
    folder.mkdir()
    res = _engine(folder)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == (
        f"loadgen: error: loadgen sim engine: argument --out: {folder}: is a directory, expected a file to write "
        "(see loadgen sim engine --help)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engines"] and not list(folder.iterdir())


def test_settings_past_the_profiles_grid_are_said_where_the_engine_is_written(tmp_path):
    # vLLM's defaults on a 96 GB GPU (8,192 tokens, 1,024 sequences, the model's 131,072) run past the profile's
    # measured grid (2,048 tokens, 256 sequences and decodes, KV 16,384: read from its CSVs below)
    res = _engine(tmp_path / "defaults.toml")
    assert res.returncode == 0, res.stderr
    tp1 = PRO6000_LLAMA / "tp1"
    tokens = max(int(r["tokens"]) for r in csv.DictReader((tp1 / "dense.csv").open()))
    kv = max(int(r["kv_decode"]) for r in csv.DictReader((tp1 / "attention.csv").open()))
    assert (tokens, kv) == (2048, 16384)
    for phrase in (
        f"max_num_batched_tokens 8,192 > the profiled {tokens:,} tokens",
        "max_num_seqs 1,024 > the profiled 256 sequences",
        f"max_model_len 131,072 > the profiled KV length {kv:,}",
    ):
        assert phrase in res.stdout and phrase in (tmp_path / "defaults.toml").read_text(), phrase
    flags = ("--max-num-seqs", "128", "--max-num-batched-tokens", "2048", "--max-model-len", "16384")
    within = _engine(tmp_path / "within.toml", *flags)
    assert within.returncode == 0 and "past the profile" not in within.stdout
    assert "Past the profile" not in (tmp_path / "within.toml").read_text()


def test_sim_run_says_how_much_of_the_replay_the_profile_measured(tmp_path):
    from loadgen.trace.io import write_trace

    trace = write_trace(_trace(6), tmp_path / "t.parquet", {"generator": "test", "seed": 0})
    engine = tmp_path / "wide.toml"  # 8,192 tokens a step: a 4,000-token prompt prefills past the profiled 2,048
    assert _engine(engine, "--max-num-batched-tokens", "8192", "--max-model-len", "16384").returncode == 0
    table = _trace(1).to_pydict()
    table["prompt_tokens"] = [4000]
    long = write_trace(pa.Table.from_pydict(table, schema=TRACE_FULL_SCHEMA), tmp_path / "l.parquet", {"seed": 0})
    cmd = [sys.executable, "-m", "loadgen", "sim", "run"]
    within = subprocess.run([*cmd, str(trace), "--engine", str(engine), "--out", str(tmp_path / "a")], **_TEXT)
    assert within.returncode == 0 and "profile grid: all " in within.stdout, within.stdout + within.stderr
    past = subprocess.run([*cmd, str(long), "--engine", str(engine), "--out", str(tmp_path / "b")], **_TEXT)
    assert past.returncode == 0, past.stderr
    assert "profile grid: 1 of " in past.stdout and "tokens in a step > 2,048 (1)" in past.stdout, past.stdout


_TEXT = {"capture_output": True, "text": True}


def _damaged_profile(tmp_path: Path, table: str, damage) -> Path:
    """A copy of the shipped RTX PRO 6000 Llama profile with one table rewritten by ``damage`` (its text in, out)."""
    import shutil

    copy = tmp_path / "profile"
    shutil.copytree(PRO6000_LLAMA, copy)
    path = copy / table
    path.write_text(damage(path.read_text()))
    return copy


@pytest.mark.parametrize(
    ("table", "damage", "said"),
    [
        (
            "tp1/dense.csv",
            lambda text: "",
            "tp1/dense.csv: empty: expected an operator profile CSV (loadgen sim engine --profile) with columns layer, tokens, time_us",
        ),
        ("tp1/dense.csv", lambda text: text.splitlines()[0] + "\n", "tp1/dense.csv: no rows under the header"),
        ("tp1/dense.csv", lambda text: text.replace("layer,", "op,", 1), "tp1/dense.csv: column 'layer': missing"),
        (
            "tp1/dense.csv",
            lambda text: "\n".join(ln for ln in text.splitlines() if not ln.startswith("qkv_proj,")),
            "tp1/dense.csv: layer 'qkv_proj': no rows",
        ),
        ("tp1/per_sequence.csv", lambda text: "", "tp1/per_sequence.csv: empty"),
        (
            "tp1/per_sequence.csv",
            lambda text: "\n".join(ln for ln in text.splitlines() if not ln.startswith("lm_head,")),
            "tp1/per_sequence.csv: layer 'lm_head': no rows",
        ),
        ("tp1/skew_fit.csv", lambda text: text.replace("n_label", "nl", 1), "tp1/skew_fit.csv: column 'n_label'"),
        ("tp1/attention.csv", lambda text: text.replace("kv_decode", "kvd", 1), "column 'kv_decode': missing"),
    ],
)
def test_a_damaged_profile_table_is_refused_by_file_and_field(tmp_path, table, damage, said):
    """An empty table, a header without rows, a missing column or a missing operator is one line naming the
    file and the field (exit 2, no file written), not a traceback or an operator priced at nothing."""
    profile = _damaged_profile(tmp_path, table, damage)
    out = tmp_path / "e.toml"
    cmd = [sys.executable, "-m", "loadgen", "sim", "engine", "--profile", str(profile), "--model-config", str(LLAMA)]
    res = subprocess.run([*cmd, "--max-model-len", "32768", "--out", str(out)], capture_output=True, text=True)
    assert res.returncode == 2 and said in res.stderr, res.stderr[-2000:]
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert not out.exists()


def test_a_profile_whose_meta_says_it_fitted_skew_needs_the_fit(tmp_path):
    profile = _damaged_profile(tmp_path, "meta.yaml", lambda text: text)
    (profile / "tp1" / "skew_fit.csv").unlink()
    out = tmp_path / "e.toml"
    cmd = [sys.executable, "-m", "loadgen", "sim", "engine", "--profile", str(profile), "--model-config", str(LLAMA)]
    res = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True)
    assert res.returncode == 2 and "tp1/skew_fit.csv: no such file: expected an operator profile CSV" in res.stderr, (
        res.stderr
    )
    assert not out.exists()


def test_settings_left_out_say_default_and_settings_given_say_given(tmp_path):
    """tp, ep and gpu_memory_utilization said 'given' (the pool's utilization said nothing) when they were vLLM's
    defaults, not arguments; given, even at the default value, they say so."""
    out = tmp_path / "defaults.toml"
    assert _engine(out, "--max-model-len", "32768").returncode == 0
    text = out.read_text()
    assert "tp = 1  # default" in text and "ep = 1  # default" in text
    assert "x gpu_memory_utilization 0.9 (default), TP 1:" in text
    given = tmp_path / "given.toml"
    res = _engine(given, "--max-model-len", "32768", "--tp", "1", "--ep", "1", "--gpu-memory-utilization", "0.92")
    assert res.returncode == 0, res.stderr
    text = given.read_text()
    assert "tp = 1  # given" in text and "ep = 1  # given" in text
    assert "x gpu_memory_utilization 0.92 (given), TP 1:" in text


def test_an_engine_copied_away_from_its_profile_names_the_toml_and_the_field(tmp_path):
    """The shipped engine TOML copied elsewhere (to edit a setting): its profile path is relative to its folder,
    so the refusal names the TOML and `[cost.profile] path` (it named only a meta.yaml path nobody wrote)."""
    copy = tmp_path / "mine.toml"
    copy.write_text((ROOT / "scenarios" / "engines" / "rtx4090-llama-3.1-8b-tp1.toml").read_text())
    trace = tmp_path / "t.parquet"
    from loadgen.trace.io import write_trace

    write_trace(_trace(3), trace, {"mode": "open"})
    cmd = [sys.executable, "-m", "loadgen", "sim", "run", str(trace), "--engine", str(copy)]
    res = subprocess.run([*cmd, "--out", str(tmp_path / "run")], capture_output=True, text=True)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert f"{copy}: [cost.profile] path = 'profiles/RTX4090/meta-llama/Llama-3.1-8B/bf16': no such path" in res.stderr
    (tmp_path / "profiles").symlink_to(PROFILES)  # beside its profiles again, it runs
    assert subprocess.run([*cmd, "--out", str(tmp_path / "run2")], capture_output=True, text=True).returncode == 0
