"""Held out: how well the profiled cost model reads the parts of its operator profiles no measured run exercises.

For every shipped operator profile (GPU x model x TP degree, from the engine presets whose ``[cost.profile]``
has ep = 1; the -ep2 engine reads the same tables), with ``loadgen.sim.profile_holdout`` (which reads tables
with the functions that price a step in ``loadgen.sim.profile``):

1. **Leave one out.** Each interior measured point of each table is removed and read back from the rest:
   dense operators by tokens (150 points each), lm_head and sampler by sequences (38), the MoE kernel by tokens
   at each profiled expert count, each attention grid (decode-only; with a prefill chunk) along each of its
   axes (every grid cell at the removed axis value is one point). Printed per profile: per table family and
   per table, the points counted, the median, p90 (numpy-linear) and maximum of |error|, the signed median, and
   the coordinates of the worst point. Error = 100 x (predicted - measured) / measured, of one layer's operator.
2. **Thinned steps.** Every table cut to every other profiled point (``thin_profile``: each axis keeps its 0, its
   first and last positive point and every second one between; MoE expert counts all kept), and whole steps
   priced with it against the full profile (``step_us``, all layers, TP all-reduces over the engine's assumed
   link): decode-only batches of n = 1, 2, 4, ... up to the profile's largest decode count at mean KV 512,
   2,048 and 8,192 tokens; prefill chunks of 256, 512, 1,024 and 2,048 tokens over 0 and 4,096 cached tokens;
   mixed steps of a 256, 512 or 1,024-token chunk (no cache) with 2, 8, 32 or 128 decodes at KV 2,048. Error =
   100 x (thinned - full) / full. The thinned grid is twice as coarse as the profile's: the figure is the error
   of a step between two points twice as far apart as the profiled ones.

Deterministic: the profiles' own numbers, no randomness, no timing.

    python benchmarks/bench_profile_holdout.py            # every profile
    python benchmarks/bench_profile_holdout.py --tables   # also every table of every profile
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadgen.sim import list_presets, load_engine_config
from loadgen.sim.profile import OperatorProfile
from loadgen.sim.profile_holdout import HeldOut, profile_leave_one_out, summarize_errors, thin_profile

#: A step: (prefill tokens, cached prefix tokens, decodes, mean decode KV tokens).
Step = tuple[int, int, int, int]


def shipped_profiles() -> dict[str, OperatorProfile]:
    """Engine name -> its profile, one engine per (profile folder, TP degree), ep = 1."""
    out: dict[str, OperatorProfile] = {}
    seen: set[tuple[str, int]] = set()
    for name in list_presets():
        p = load_engine_config(name).cost.profile
        if p is None or p.ep != 1 or (p.path, p.tp) in seen:
            continue
        seen.add((p.path, p.tp))
        out[name] = p.load()
    return out


def _row(label: str, points: Sequence[HeldOut], width: int) -> str:
    s = summarize_errors([h.error_pct for h in points])
    worst = max(points, key=lambda h: abs(h.error_pct)).at if points else ()
    at = ",".join(str(v) for v in worst)
    return (
        f"{label:<{width}} {s.points:>6} {s.median_abs_pct:>7.2f} {s.p90_abs_pct:>7.2f} {s.max_abs_pct:>7.2f} "
        f"{s.median_signed_pct:>+8.2f}  {at}"
    )


def _header(first: str, width: int, where: str) -> str:
    return f"{first:<{width}} {'points':>6} {'|med|%':>7} {'|p90|%':>7} {'|max|%':>7} {'signed%':>8}  {where}"


def _family(table: str) -> str:
    """dense / per-sequence / moe / attention decode-only / attention with chunk."""
    return table.split(" along ")[0] if table.startswith("attention") else table.split(" ")[0]


def print_leave_one_out(name: str, profile: OperatorProfile, every_table: bool) -> None:
    tables = profile_leave_one_out(profile)
    families: dict[str, list[HeldOut]] = {}
    for table, points in tables.items():
        families.setdefault(_family(table), []).extend(points)
    print(f"\n{name}: leave one out, one layer's operator (worst at: the point's coordinates)")
    print(_header("table family", 40, "worst at"))
    for family, points in families.items():
        print(_row(family, points, 40))
    print(_row("all points", [h for points in tables.values() for h in points], 40))
    if every_table:
        for table, points in tables.items():
            print(_row(f"  {table}", points, 40))


def step_grid(profile: OperatorProfile) -> dict[str, list[Step]]:
    """The steps priced full and thinned, by kind (the module docstring's grid)."""
    decodes = [2**k for k in range(12) if 2**k <= profile.decode_attention.nd[-1]]
    return {
        "decode-only": [(0, 0, n, kv) for n in decodes for kv in (512, 2048, 8192)],
        "prefill": [(chunk, cached, 0, 0) for chunk in (256, 512, 1024, 2048) for cached in (0, 4096)],
        "mixed": [(chunk, 0, n, 2048) for chunk in (256, 512, 1024) for n in (2, 8, 32, 128)],
    }


def _step_us(profile: OperatorProfile, step: Step) -> float:
    chunk, cached, n, kv = step
    return profile.step_us(chunk, cached, n, n * kv, n + (1 if chunk else 0))


def print_thinned_steps(profiles: dict[str, OperatorProfile]) -> None:
    print("\nThinned steps: whole steps, every table at every other point vs the full profile")
    print("(worst at: prefill tokens, cached tokens, decodes, mean decode KV)")
    print(_header("engine / step kind", 46, "worst at"))
    for name, profile in profiles.items():
        thinned = thin_profile(profile)
        for kind, steps in step_grid(profile).items():
            points = [HeldOut(step, _step_us(profile, step), _step_us(thinned, step)) for step in steps]
            print(_row(f"{name} {kind}", points, 46))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", action="store_true", help="print every table's row, not only each family's")
    args = ap.parse_args()
    profiles = shipped_profiles()
    print(f"{len(profiles)} profiles: " + ", ".join(profiles))
    for name, profile in profiles.items():
        print_leave_one_out(name, profile, args.tables)
    print_thinned_steps(profiles)
    return 0


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        sys.exit(main())
