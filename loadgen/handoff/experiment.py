"""The experiment policy: one variable to change next, derived from the first failure and the engine config.

It is a proposal, never a measurement: the rerun applies it and measures the failing check again.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MEMORY_SIGNALS", "find_key", "inner_engine_config", "propose_experiment", "set_dotted"]

#: Failure "metrics" that are memory signals rather than latency budgets.
MEMORY_SIGNALS = ("kv_cache_saturated", "preemptions", "engine_oom")

_WINDOW = ("window_ms", "batching_window_ms")
_SEQS = ("max_num_seqs",)
_TOKENS = ("max_num_batched_tokens",)
_KV_BUDGET = ("gpu_memory_utilization", "kv_cache_gib", "num_kv_blocks")


def find_key(config: Any, names: tuple[str, ...]) -> tuple[str, Any] | None:
    """The first (dotted path, value) whose last key is in ``names``, searching nested dicts."""
    if not isinstance(config, dict):
        return None
    for key, value in config.items():
        if key in names and not isinstance(value, dict) and value is not None:
            return key, value
    for key, value in config.items():
        if isinstance(value, dict):
            found = find_key(value, names)
            if found:
                return f"{key}.{found[0]}", found[1]
    return None


def set_dotted(config: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``config[a][b][c] = value`` for ``dotted = "a.b.c"``, creating tables on the way."""
    parts = dotted.split(".")
    node = config
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def inner_engine_config(engine: Any) -> dict[str, Any] | None:
    """The engine's own settings from a manifest ``target.engine`` entry (unwrapping ``config.config``)."""
    if not isinstance(engine, dict):
        return None
    config = engine.get("config")
    while isinstance(config, dict) and isinstance(config.get("config"), dict):
        config = config["config"]
    return config if isinstance(config, dict) else None


def _change(var: tuple[str, Any], new: Any, why: str) -> dict[str, Any]:
    return {"variable": var[0], "from": var[1], "to": new, "hypothesis": why}


def _memory_change(cfg: dict[str, Any]) -> dict[str, Any]:
    """Under memory pressure: fewer sequences, else a larger KV budget."""
    seqs = find_key(cfg, _SEQS)
    kv_budget = find_key(cfg, _KV_BUDGET)
    if seqs and isinstance(seqs[1], (int, float)) and seqs[1] > 1:
        return _change(
            seqs,
            max(1, int(seqs[1]) // 2),
            "fewer concurrent sequences lower the KV cache high-water mark and preemptions",
        )
    if kv_budget:
        new = round(min(0.95, kv_budget[1] + 0.05), 2) if kv_budget[0].endswith("utilization") else kv_budget[1] * 2
        return _change(kv_budget, new, "a larger KV budget removes saturation if weights and activations still fit")
    return {
        "variable": "max_num_seqs",
        "from": None,
        "to": "half the current value",
        "hypothesis": "fewer concurrent sequences lower the KV cache high-water mark",
    }


def _latency_change(metric: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """For a latency or error budget: the batching window, the step token budget, or the decode batch."""
    window = find_key(cfg, _WINDOW)
    seqs = find_key(cfg, _SEQS)
    tokens = find_key(cfg, _TOKENS)
    if (
        metric in ("ttft_ms", "e2e_ms", "error_share")
        and window
        and isinstance(window[1], (int, float))
        and window[1] > 0
    ):
        return _change(
            window,
            window[1] / 2,
            "the batching window holds new requests before prefill; halving it should cut the queue part of TTFT",
        )
    if metric == "ttft_ms" and tokens and isinstance(tokens[1], int):
        return _change(
            tokens,
            tokens[1] * 2,
            "a larger per-step token budget admits queued prefills sooner (watch ITL, which may rise)",
        )
    if metric in ("itl_ms", "e2e_ms") and tokens and isinstance(tokens[1], int) and tokens[1] > 2048:
        return _change(
            tokens, tokens[1] // 2, "smaller prefill chunks interleaved with decode shorten the longest decode steps"
        )
    if metric in ("itl_ms", "e2e_ms") and seqs and isinstance(seqs[1], int) and seqs[1] > 1:
        return _change(seqs, seqs[1] // 2, "a smaller decode batch shortens each decode step")
    return {
        "variable": "offered load (trace time scale)",
        "from": 1.0,
        "to": 2.0,
        "hypothesis": "replaying the same trace at half the rate locates where the budget starts to hold",
    }


def _quota_change(refused: int, failed: int) -> dict[str, Any]:
    """When quota rejections are what failed: the offered rate, since no engine setting moves a provider's quota."""
    return {
        "variable": "offered rate (loadgen run --rate-limit-rps)",
        "from": "the run's",
        "to": "under the endpoint's request quota",
        "hypothesis": (
            f"{refused} of the {failed} failed requests were refused by a quota (HTTP 429 with Retry-After) and count "
            "as failures in every check; replayed under the quota (or with a higher one), the checks measure serving "
            "latency instead of the quota"
        ),
    }


def propose_experiment(
    failures: list[dict[str, Any]],
    engine_config: dict[str, Any] | None,
    trace_name: str | None,
    error_kinds: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One variable to change next, derived from the first failure and the engine config (a proposal).

    ``error_kinds``: the run's failed requests by kind; when at least half are quota rejections (``http_429``)
    a latency or error failure is the quota's, and the proposal is the offered rate."""
    kinds = error_kinds or {}
    failed = sum(kinds.values())
    refused = kinds.get("http_429", 0)
    cfg = engine_config or {}
    memory = [f for f in failures if f.get("metric") in MEMORY_SIGNALS]
    first = memory[0] if memory else (failures[0] if failures else None)  # memory pressure explains the rest
    metric = (first or {}).get("metric", "")
    proposal: dict[str, Any]
    if first is None:
        proposal = {
            "variable": None,
            "from": None,
            "to": None,
            "hypothesis": "no budget failed in this run; rerun unchanged to confirm the result repeats",
        }
    elif metric in MEMORY_SIGNALS:
        proposal = _memory_change(cfg)
    elif refused and 2 * refused >= failed:
        proposal = _quota_change(refused, failed)
    else:
        proposal = _latency_change(metric, cfg)
    proposal.update(
        {
            "status": "proposal (not measured)",
            "target_check": None
            if first is None
            else {k: first.get(k) for k in ("class", "metric", "percentile", "limit")},
            "keep_fixed": [
                "model and weights",
                "engine version",
                "hardware",
                "trace " + repr(trace_name) + " and seed",
                "every other engine setting",
                "warm/cold state",
            ],
            "measure": "the failing check above, with its sample count, over at least 3 repeats",
        }
    )
    return proposal
