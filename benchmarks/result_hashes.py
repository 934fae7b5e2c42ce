"""Check: the sha256 of every typed result's JSON (analysis, decision, region, fidelity) from a pinned pipeline.

Run it before and after a change to the result models: the same hashes mean the JSON users script against
is byte-identical. Deterministic parts run on the virtual-time worksheet (two presets on the canonical burst
trace, seed 0): ``analyze --json`` of each, ``compare`` of the two, ``plan quick.toml --sim-worksheet``, and
the fidelity rows/summary/goal of one worksheet against the other. Parts that need a live engine on
loopback (``practice``'s decision.json, ``sim validate``'s fidelity.json) have timing in their numbers, so
their *skeleton* is hashed instead: every key in order with its value's JSON type (numbers as "number").
Wall-clock stamps (UTC instants, a plan's consumed time) are blanked in the bytes before hashing.

    python benchmarks/result_hashes.py                 # prints "<sha256>  <name>" per output
    python benchmarks/result_hashes.py --dir /tmp/rh   # fixed paths: the analysis JSON records its run_dir
    python benchmarks/result_hashes.py --no-live       # worksheet parts only (a few seconds)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "traces" / "canonical-burst.parquet"
ENGINES = ("interactive-small-batch", "throughput-large-batch")


def _cli(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, env=env, cwd=REPO)
    if res.returncode != 0:
        raise SystemExit(f"loadgen {' '.join(args)}: exit {res.returncode}: {res.stderr[-2000:]}")
    return res.stdout


#: Wall-clock stamps in the otherwise pinned outputs, blanked in the raw bytes (all else is hashed as written).
_CLOCK = (
    (re.compile(rb'"\d{4}-\d\d-\d\dT\d\d:\d\d:[0-9.]+\+00:00"'), b'"<utc>"'),
    (re.compile(rb'("consumed_time_s": )[0-9.e+-]+'), rb"\1<s>"),
)


def _sha(data: bytes) -> str:
    for pattern, blank in _CLOCK:
        data = pattern.sub(blank, data)
    return hashlib.sha256(data).hexdigest()


def skeleton(value: Any) -> Any:
    """Keys in order and each leaf's JSON type: what a script reading the file depends on, without timings."""
    if isinstance(value, dict):
        return {k: skeleton(v) for k, v in value.items()}
    if isinstance(value, list):
        return [skeleton(v) for v in value]
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    return "number" if isinstance(value, (int, float)) else type(value).__name__


def _fidelity_rows(real_dir: Path, sim_dir: Path) -> bytes:
    """The fidelity table's deterministic core: one worksheet as 'measured', the other as 'simulated'."""
    import importlib  # why: the module, not the package's ``validate`` function of the same name

    from loadgen.analysis import analyze_run  # why: the library only here, after the CLI parts ran

    V = importlib.import_module("loadgen.calibration.validate")

    analyses = [analyze_run(d) for d in (real_dir, sim_dir)]
    real, sim = (a.result() if hasattr(a, "result") else a.to_dict() for a in analyses)  # typed since the results
    rows = V._compare("canonical-burst", real, sim, None)
    dump = [r.model_dump() if hasattr(r, "model_dump") else r.to_dict() for r in rows]
    doc = {"rows": dump, "summary": V._summary(rows), "goal": V.goal_check(rows, rows)}
    return (json.dumps(json.loads(json.dumps(doc, default=str)), indent=2) + "\n").encode()


def _worksheet_parts(work: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    runs = []
    for engine in ENGINES:
        run = work / f"ws-{engine}"
        _cli("sim", "run", str(TRACE), "--engine", engine, "--out", str(run), "--seed", "0")
        _cli("analyze", str(run), "--json", str(work / f"analysis-{engine}.json"), "--quiet")
        out[f"analysis-{engine}.json"] = (work / f"analysis-{engine}.json").read_bytes()
        runs.append(run)
    stdout = _cli("compare", *map(str, runs), "--out", str(work / "decision.json"), "--json")
    out["decision.json"] = (work / "decision.json").read_bytes()
    out["compare --json (stdout)"] = stdout.encode()
    plan = REPO / "scenarios" / "plans" / "quick.toml"
    _cli("plan", str(plan), "--sim-worksheet", ENGINES[0], "--out", str(work / "plan"), "--quiet")
    out["region.json"] = (work / "plan" / "region.json").read_bytes()
    out["fidelity rows+summary+goal"] = _fidelity_rows(runs[0], runs[1])
    return out


def _live_parts(work: Path) -> dict[str, bytes]:
    from loadgen.targets import launch_sim_server  # why: the live engine only for these parts

    out: dict[str, bytes] = {}
    _cli("practice", "--out", str(work / "practice"), "--window-s", "10")
    decision = json.loads((work / "practice" / "decision.json").read_text())
    out["practice decision.json (skeleton)"] = json.dumps(skeleton(decision), indent=1).encode()
    with launch_sim_server("instant") as sim:
        args = ["sim", "validate", "instant", "--target", sim.base_url, "--out", str(work / "val")]
        _cli(*args, "--duration-s", "5", "--no-warmup")
    fidelity = json.loads((work / "val" / "fidelity.json").read_text())
    out["sim validate fidelity.json (skeleton)"] = json.dumps(skeleton(fidelity), indent=1).encode()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/loadgen-result-hashes", help="work directory (emptied first)")
    parser.add_argument("--no-live", action="store_true", help="skip the parts on a live engine (practice, validate)")
    parser.add_argument("--keep", action="store_true", help="keep the outputs (else only the hashes are printed)")
    args = parser.parse_args()
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    outputs = _worksheet_parts(work) | ({} if args.no_live else _live_parts(work))
    for name, data in outputs.items():
        print(f"{_sha(data)}  {name}")
    if args.keep:
        (work / "skeletons").mkdir()
        for name, data in outputs.items():
            (work / "skeletons" / name.replace(" ", "_").replace("/", "_")).write_bytes(data)
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
