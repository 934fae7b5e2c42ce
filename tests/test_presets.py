"""Shipped presets: found through the package (not the checkout), resolvable by name, copied out by ``scenario init``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from loadgen.contract.responder import SHIPPED_CASES_DIR
from loadgen.sim.config import PRESETS_DIR, list_presets, load_engine_config
from loadgen.workload import presets

REPO = Path(__file__).resolve().parents[1]


def test_presets_are_the_top_level_scenarios_directory() -> None:
    # one source of truth: the package's scenarios/ is the checkout's scenarios/ (a wheel carries a copy)
    assert presets.presets_root() == (REPO / "scenarios").resolve()
    assert presets.preset_dir("engines") == PRESETS_DIR
    assert presets.preset_dir("contract") == SHIPPED_CASES_DIR
    assert presets.canonical_scenario().is_file() and presets.prices_example().is_file()
    assert presets.canonical_trace("burst") is not None and presets.canonical_trace("nope") is None
    assert list_presets() == [
        "instant",
        "instant-long-context",
        "interactive-small-batch",
        "rtx4090-llama-3.1-8b-tp1",
        "rtxpro6000-llama-3.1-8b-tp1",
        "rtxpro6000-llama-3.1-8b-tp2",
        "rtxpro6000-qwen3-30b-a3b-tp1",
        "rtxpro6000-qwen3-30b-a3b-tp1-ep2",
        "rtxpro6000-qwen3-30b-a3b-tp2",
        "rtxpro6000-qwen3-32b-tp1",
        "rtxpro6000-qwen3-32b-tp2",
        "throughput-large-batch",
    ]
    assert presets.list_presets("plans") == ["canonical-region", "fleet", "quick"]


def test_resolve_prefers_an_existing_path_then_a_preset_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert presets.resolve("engines", "instant") == presets.preset_dir("engines") / "instant.toml"
    assert presets.resolve("engines", "no-such") is None
    assert presets.resolve("engines", "instant.toml") is None  # a file name is a path, never a preset
    assert load_engine_config("instant").name == "instant"
    (tmp_path / "instant").write_text("")
    assert presets.resolve("engines", "instant") == Path("instant")


def test_scenario_init_copies_every_preset_and_refuses_to_overwrite(tmp_path: Path) -> None:
    dest = tmp_path / "mine"
    cmd = [sys.executable, "-m", "loadgen", "scenario", "init", str(dest)]
    first = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=REPO)
    assert first.returncode == 0, first.stderr
    shipped = sorted(p.relative_to(presets.presets_root()) for p in presets.presets_root().rglob("*.toml"))
    copied = sorted(p.relative_to(dest) for p in dest.rglob("*.toml"))
    assert copied == shipped and len(copied) >= 8
    for rel in copied:
        assert (dest / rel).read_bytes() == (presets.presets_root() / rel).read_bytes()
    again = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=REPO)
    assert again.returncode == 2 and again.stderr.startswith("loadgen: error: ") and "already exists" in again.stderr
    forced = subprocess.run(cmd + ["--force"], check=False, capture_output=True, text=True, cwd=REPO)
    assert forced.returncode == 0
    # the copied plan still finds its scenario (relative path inside the copied tree)
    check = subprocess.run(
        [sys.executable, "-m", "loadgen", "scenario", "check", str(dest / "canonical.toml")],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert check.returncode == 0, check.stderr
