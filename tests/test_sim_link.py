"""The link the profiled engines price their collectives on: a measured NCCL table, read piecewise-linearly, or
an assumed latency + bandwidth; the engine TOML names one; TP all-reduces and the EP exchange use it.

Expected values are computed by hand from the small tables written here (the arithmetic is beside each)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.sim import load_engine_config
from loadgen.sim.config import PRESETS_DIR
from loadgen.sim.link import AssumedLink, MeasuredLink, read_collectives
from loadgen.sim.profile import load_profile
from loadgen.util.errors import ScenarioError

PROFILES = PRESETS_DIR / "profiles"
PRO_QWEN32 = str(PROFILES / "RTXPRO6000/Qwen/Qwen3-32B/bf16")
PRO_MOE = str(PROFILES / "RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16")
QWEN32 = str(PROFILES / "models/Qwen3-32B.json")
QWEN_MOE = str(PROFILES / "models/Qwen3-30B-A3B-Instruct-2507.json")
#: A link that costs nothing (to isolate a profile's collective terms).
FREE = AssumedLink(0.0, 1e15)

TABLE = """collective,ranks,bytes,us
all_reduce,2,4096,10
all_reduce,2,1048576,40
all_reduce,2,2097152,70
all_gather,2,4096,8
all_gather,2,1048576,20
reduce_scatter,2,4096,9
reduce_scatter,2,1048576,30
"""


def _table(tmp_path: Path, text: str = TABLE) -> MeasuredLink:
    path = tmp_path / f"collectives-{abs(hash(text))}.csv"  # one file a table: read_collectives caches by path
    path.write_text(text)
    return read_collectives(str(path))


def test_measured_link_reads_between_below_and_beyond_its_samples(tmp_path: Path) -> None:
    link = _table(tmp_path)
    assert link.all_reduce_us(4096, 2) == 10.0  # a sample
    assert link.all_reduce_us(526_336, 2) == pytest.approx(25.0)  # halfway 4,096 -> 1,048,576: (10 + 40) / 2
    assert link.all_reduce_us(1_572_864, 2) == pytest.approx(55.0)  # halfway 1 MiB -> 2 MiB: (40 + 70) / 2
    assert link.all_reduce_us(100, 2) == 10.0  # below the smallest sample: its time
    assert link.all_reduce_us(0, 2) == 10.0
    # above the largest: the last segment's slope, 30 us per 1,048,576 B, continued: 70 + 30 at 3 MiB
    assert link.all_reduce_us(3_145_728, 2) == pytest.approx(100.0)
    assert link.all_gather_us(526_336, 2) == pytest.approx(14.0)  # (8 + 20) / 2
    assert link.reduce_scatter_us(2_093_056, 2) == pytest.approx(51.0)  # 9 + 2 x 21: one segment beyond 1 MiB


def test_measured_link_refuses_what_it_did_not_measure(tmp_path: Path) -> None:
    link = _table(tmp_path)
    with pytest.raises(ScenarioError, match=r"collective = 'all_reduce', ranks = 4: no such samples"):
        link.all_reduce_us(4096, 4)
    with pytest.raises(ScenarioError, match=r":3: us = 'x': expected a number"):
        _table(tmp_path, "collective,ranks,bytes,us\nall_reduce,2,4096,10\nall_reduce,2,8192,x\n")
    with pytest.raises(ScenarioError, match=r"collective = 'broadcast': expected one of"):
        _table(tmp_path, "collective,ranks,bytes,us\nbroadcast,2,4096,10\n")
    with pytest.raises(ScenarioError, match=r"all_gather at 2 ranks: 1 sample: expected at least 2"):
        _table(tmp_path, "collective,ranks,bytes,us\nall_gather,2,4096,10\n")


def test_the_assumed_link_keeps_its_formula() -> None:
    link = AssumedLink(20.0, 16.0)
    assert link.all_reduce_us(1_600_000, 2) == pytest.approx(120.0)  # 20 + 1.6 MB / 16 GB/s
    assert link.all_gather_us(1_600_000, 3) == pytest.approx(220.0)  # 20 + the other 2 ranks' 3.2 MB / 16 GB/s
    assert link.reduce_scatter_us(1_600_000, 2) == pytest.approx(120.0)


def test_a_tp2_step_adds_two_table_all_reduces_a_layer(tmp_path: Path) -> None:
    measured = load_profile(PRO_QWEN32, 2, QWEN32, link=_table(tmp_path))
    free = load_profile(PRO_QWEN32, 2, QWEN32, link=FREE)
    assert (measured.layers, measured.hidden_size) == (64, 5120)
    # 100 tokens x 5,120 x 2 B = 1,024,000 B: 10 + (1,024,000 - 4,096) / (1,048,576 - 4,096) x 30 us
    one = 10 + (1_024_000 - 4096) / (1_048_576 - 4096) * 30
    assert measured.tokens_us(100) - free.tokens_us(100) == pytest.approx(64 * 2 * one)


def test_an_ep2_step_exchanges_at_its_busiest_rank_and_syncs_the_dp_ranks(tmp_path: Path) -> None:
    link = _table(tmp_path)
    measured = load_profile(PRO_MOE, 1, QWEN_MOE, ep=2, link=link)
    free = load_profile(PRO_MOE, 1, QWEN_MOE, ep=2, link=FREE)
    h, layers = measured.hidden_size, measured.moe_layers
    assert (h, layers) == (2048, 48)
    # 100 tokens a rank: all-gather + reduce-scatter of 409,600 B local, and one all-reduce of 4 x 2 int32 (32 B)
    ag = 8 + (409_600 - 4096) / (1_048_576 - 4096) * 12
    rs = 9 + (409_600 - 4096) / (1_048_576 - 4096) * 21
    assert measured.tokens_us(100) - free.tokens_us(100) == pytest.approx(layers * (ag + rs) + 10.0)
    # unequal ranks (100 here, 400 there): the exchange runs at the busier rank's 400 tokens (1,638,400 B local)
    ag400 = 20 + (1_638_400 - 1_048_576) / (1_048_576 - 4096) * 12
    rs400 = 30 + (1_638_400 - 1_048_576) / (1_048_576 - 4096) * 21
    link_delta = measured.group_delta_us(100, 500, 400) - free.group_delta_us(100, 500, 400)
    assert link_delta == pytest.approx(layers * (ag400 + rs400 - ag - rs))
    assert measured.group_delta_us(100, 500) == measured.group_delta_us(100, 500, 400)  # 2 ranks: the rest's


def test_the_shipped_pro6000_tp2_engine_names_the_measured_table() -> None:
    cfg = load_engine_config("rtxpro6000-qwen3-32b-tp2")
    p = cfg.cost.profile
    assert p is not None and p.collectives is not None and p.collectives.endswith("RTXPRO6000/collectives.csv")
    link = p.link()
    assert isinstance(link, MeasuredLink)
    assert link.all_reduce_us(1_048_576, 2) == pytest.approx(41.04100167751312)  # the hardware.yaml sample
    assert "measured link profiles/RTXPRO6000/collectives.csv" in cfg.calibration_label()
    assert p.load().identity()["link"] == link.describe()


def test_an_engine_toml_giving_both_links_is_refused_in_one_line(tmp_path: Path) -> None:
    text = (PRESETS_DIR / "rtxpro6000-qwen3-32b-tp2.toml").read_text()
    profiles = str(PROFILES).replace("\\", "/")
    text = text.replace('"profiles/', f'"{profiles}/').replace(
        'collectives = "', 'link_latency_us = 20.0\ncollectives = "'
    )
    engine = tmp_path / "both.toml"
    engine.write_text(text)
    cmd = [sys.executable, "-m", "loadgen", "sim", "run", str(tmp_path / "t.parquet"), "--engine", str(engine)]
    res = subprocess.run([*cmd, "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "collectives = " in res.stderr and "link_latency_us both given" in res.stderr


def test_a_cuda_graph_dp_step_pads_every_rank_to_the_busiest(tmp_path: Path) -> None:
    from loadgen.sim.profile import cudagraph_capture_sizes, dp_padded

    # vLLM 0.19's default largest CUDA graph: min(2 x max_num_seqs, 512) tokens; past it, eager and unpadded
    assert dp_padded(256, cudagraph_capture_sizes(128)) and not dp_padded(257, cudagraph_capture_sizes(128))
    assert dp_padded(512, cudagraph_capture_sizes(512)) and not dp_padded(513, cudagraph_capture_sizes(1024))
    assert not dp_padded(1, [])  # an engine without CUDA graphs never pads
    p = load_profile(PRO_MOE, 1, QWEN_MOE, ep=2, link=_table(tmp_path))
    sizes = cudagraph_capture_sizes(128)
    padded, unpadded = p.group_delta_us(100, 300, 200, sizes), p.group_delta_us(100, 300, 200)
    # padded: the expert kernel runs 2 x 200 rows, not the group's 300 (the same experts activated), and the
    # exchange moves 200 rows a rank, as unpadded (200 is a capture size); the rank itself was priced at 104
    charged = p._moe_over(2 * 104, 2 * 104) + p.exchange_us(104)
    assert padded == pytest.approx(p.moe_layers * (p._moe_over(300, 400) + p.exchange_us(200) - charged))
    assert unpadded == pytest.approx(
        p.moe_layers * (p._moe_over(300, 300) + p.exchange_us(200) - p._moe_over(200, 200) - p.exchange_us(100))
    )
    # a busiest rank between capture sizes: every rank runs the next size up
    odd = p.group_delta_us(100, 301, 201, sizes)
    assert odd == pytest.approx(p.moe_layers * (p._moe_over(301, 416) + p.exchange_us(208) - charged))
