"""A run manifest's ``engine_notes`` typed (``loadgen.rundir.engine_notes``): every section a writer of this repo
writes reads back as its model, a read-then-write moves no byte (an absent key stays absent, another engine's keys
are kept), and older manifests read as they were written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from loadgen.rundir.manifest import Manifest, amend_manifest, read_manifest, write_manifest
from loadgen.rundir.schema import MANIFEST_FILE
from loadgen.targets.vllm import engine_memory
from loadgen.vllm import VllmConfig
from loadgen.vllm.launch import VllmServer, vllm_manifest_extra
from loadgen.vllm.memory import MemorySampler

DATA = Path(__file__).resolve().parent / "data"
MODEL = Path(__file__).resolve().parents[1] / "loadgen" / "data" / "models" / "tiny-llama-gqa.json"
LOG = (
    "(APIServer pid=1) INFO 11-29 08:15:26 [model.py:2152] Using max model len 2000\n"
    "(Worker pid=2) INFO 11-29 08:16:14 [cpu_worker.py:260] Explicitly set (1.0/8.71) GiB for KV cache on node 0.\n"
    "(EngineCore pid=3) INFO 11-29 08:16:14 [kv_cache_utils.py:2327] CPU KV cache size: 512,000 tokens, "
    "Maximum concurrency for 2,000 tokens per request: 256.00x\n"
)


def _rewritten(run: Path) -> bytes:
    """The manifest's bytes after a read and a write."""
    write_manifest(run, read_manifest(run))
    return (run / MANIFEST_FILE).read_bytes()


def test_a_launched_vllms_notes_read_back_typed_and_unmoved(tmp_path: Path) -> None:
    """What ``measure_with_server`` writes (the start's log notes, then memory, the re-read log and the ledger
    reconciliation, then how the engine died) through the writers' own functions, on a real memory sampler."""
    (tmp_path / "model").mkdir()
    shutil.copyfile(MODEL, tmp_path / "model" / "config.json")
    (tmp_path / "vllm.log").write_text(LOG)
    server = VllmServer(VllmConfig(tmp_path / "model", log_path=tmp_path / "vllm.log"))  # never started
    server.ready_s = 12.3456
    sampler = MemorySampler(os.getpid(), 0.01)
    sampler.sample()
    sampler.sample()
    run = tmp_path / "run"
    run.mkdir()
    write_manifest(run, Manifest())
    amend_manifest(run, {"engine_notes": vllm_manifest_extra(server, {"version": None})["engine_notes"]})
    memory, reconciliation = engine_memory(server, sampler, tmp_path / "vllm.log")
    after = {"memory": memory, "log": server.engine_notes(), "ledger_reconcile": reconciliation}
    amend_manifest(run, {"engine_notes": after})
    amend_manifest(run, {"engine_notes": {"died": "vLLM exited with code 1"}})
    written = (run / MANIFEST_FILE).read_bytes()
    notes = read_manifest(run).engine_notes
    assert notes.log is not None and notes.log.ready_s == 12.346
    assert notes.memory is not None and notes.memory.samples == 2 and notes.memory.rss_high_water_bytes
    assert notes.ledger_reconcile is not None and notes.ledger_reconcile.ok is True
    assert [r.quantity for r in notes.ledger_reconcile.rows or []][:2] == ["kv_cache_size_tokens", "max_concurrency"]
    assert notes.died == "vLLM exited with code 1" and notes.steps is None
    assert json.loads(written)["engine_notes"] == json.loads(json.dumps(after | {"died": notes.died}))
    assert _rewritten(run) == written


@pytest.mark.parametrize("name", ["manifest-9f05bca-sim-plan.json", "manifest-v1-worksheet.json"])
def test_older_manifests_keep_their_engine_notes_as_written(tmp_path: Path, name: str) -> None:
    shutil.copyfile(DATA / name, tmp_path / MANIFEST_FILE)
    old = json.loads((DATA / name).read_text())
    assert json.loads(_rewritten(tmp_path))["engine_notes"] == old["engine_notes"]


# a vLLM run written before engine_notes.log held the log's notes at the top level; another engine's own keys
LEGACY_AND_FOREIGN = {
    "kv_cache_size_tokens": 512000,
    "max_concurrency": 256.0,
    "ready_s": 30.5,
    "engine_specific": {"queue": [1, 2], "mode": "x"},
    "simulated": True,
    "steps": 3,
    "busy_s": 0,
    "output_tokens_per_busy_s": None,
    "profile_grid": {
        "steps": 3,
        "steps_beyond": 1,
        "profiled_s": 0.25,
        "profiled_s_beyond": 0,
        "by_axis": {"tokens": 1},
        "grid": {"tokens": 8, "sequences": 4, "prefill_chunk": 8, "cached_prefix": 0, "decodes": 4, "kv": 64},
    },
}


def test_a_read_then_write_keeps_every_key_and_number_as_written(tmp_path: Path) -> None:
    """Keys no model names are kept; an int stays an int (busy_s 0, not 0.0); an absent key (the grid's
    expert_tokens) stays absent, never a written null."""
    write_manifest(tmp_path, Manifest())
    amend_manifest(tmp_path, {"engine_notes": LEGACY_AND_FOREIGN})
    written = (tmp_path / MANIFEST_FILE).read_bytes()
    assert json.loads(written)["engine_notes"] == LEGACY_AND_FOREIGN
    assert _rewritten(tmp_path) == written
    grid = read_manifest(tmp_path).engine_notes.profile_grid
    assert grid is not None and grid.grid.kv == 64 and grid.by_axis == {"tokens": 1}


DAMAGED_NOTES = [
    ({"steps": -1}, "field engine_notes.steps: input should be greater than or equal to 0"),
    ({"busy_s": "x"}, "field engine_notes.busy_s: input should be a valid number"),
    ({"profile_grid": {"steps": 1}}, "field engine_notes.profile_grid.steps_beyond: field required"),
    ({"memory": {"samples": "many"}}, "field engine_notes.memory.samples: input should be a valid integer"),
    ({"log": {"kv_cache_size_tokens": 0}}, "field engine_notes.log.kv_cache_size_tokens: value error"),
    ({"routed": [1, -2]}, "field engine_notes.routed.1: input should be greater than or equal to 0"),
]


@pytest.mark.parametrize(("notes", "said"), DAMAGED_NOTES, ids=[next(iter(c[0])) for c in DAMAGED_NOTES])
def test_a_damaged_engine_note_is_one_line(tmp_path: Path, notes: dict, said: str) -> None:
    data = Manifest().to_dict() | {"engine_notes": notes}
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(Exception, match="expected a loadgen manifest") as refused:
        read_manifest(tmp_path)
    assert said in str(refused.value) and "\n" not in str(refused.value)
