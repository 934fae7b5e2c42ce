"""Fault injection: seeded per-request decisions from the engine config, or a request header.

Header ``X-Loadgen-Fault`` takes comma-separated items: ``error=503``, ``429=2.5`` (Retry-After
seconds), ``stall=1.5@10`` (stall 1.5 s after 10 tokens), ``disconnect@5``, ``malformed@3``,
``slow_start=2``. Every injected fault is appended to the fault log (JSONL: time, request id,
kind, params) and counted, so tests and analyses can count what was injected.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.util.errors import TargetError

from .config import FaultConfig

__all__ = ["FAULT_HEADER", "FAULT_KINDS", "FaultPlan", "parse_fault_header", "FaultDecider", "FaultLog"]

FAULT_HEADER = "x-loadgen-fault"
#: Kinds as logged and counted (loadgen_sim_faults_total{kind=...}); "quota" = managed-API 429.
FAULT_KINDS = ("error", "rate_limit", "stall", "disconnect", "malformed", "slow_start", "quota")


@dataclass
class FaultPlan:
    """What to do to one request; empty when nothing is injected."""

    error_status: int | None = None
    retry_after_s: float | None = None  # set: answer 429 with Retry-After
    stall_s: float = 0.0
    stall_after: int = 0
    disconnect_after: int | None = None
    malformed_after: int | None = None
    slow_start_s: float = 0.0
    source: str = "config"  # "config" or "header"

    def __bool__(self) -> bool:
        return bool(self.items())

    def items(self) -> list[tuple[str, dict[str, Any]]]:
        """(kind, params) for every fault this plan injects, in the order they would happen."""
        out: list[tuple[str, dict[str, Any]]] = []
        if self.error_status is not None:
            out.append(("error", {"status": self.error_status}))
            return out
        if self.retry_after_s is not None:
            out.append(("rate_limit", {"retry_after_s": self.retry_after_s}))
            return out
        if self.slow_start_s > 0:
            out.append(("slow_start", {"seconds": self.slow_start_s}))
        if self.stall_s > 0:
            out.append(("stall", {"seconds": self.stall_s, "after_tokens": self.stall_after}))
        if self.malformed_after is not None:
            out.append(("malformed", {"after_tokens": self.malformed_after}))
        if self.disconnect_after is not None:
            out.append(("disconnect", {"after_tokens": self.disconnect_after}))
        return out


def _num(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number") from None
    if value < 0 or value != value or value == float("inf"):
        raise ValueError(f"{what}: {text!r}: expected a finite number >= 0")
    return value


def _count(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r}: expected a token count (integer >= 0)") from None
    if value < 0:
        raise ValueError(f"{what}: {text!r}: expected a token count (integer >= 0)")
    return value


def parse_fault_header(value: str) -> FaultPlan:
    """Parse an ``X-Loadgen-Fault`` value; raise ValueError with a one-line reason."""
    plan = FaultPlan(source="header")
    for raw in value.split(","):
        item = raw.strip().lower()
        if not item:
            continue
        name, _, after = item.partition("@")
        name, _, arg = name.partition("=")
        name = name.strip()
        if name == "error":
            status = int(_num(arg, "error")) if arg else 500
            if not 400 <= status <= 599:
                raise ValueError(f"error={arg}: expected an HTTP error status 400-599")
            plan.error_status = status
        elif name in ("429", "rate_limit"):
            plan.retry_after_s = _num(arg, "429") if arg else 1.0
        elif name == "stall":
            plan.stall_s = _num(arg, "stall") if arg else 1.0
            plan.stall_after = _count(after, "stall@") if after else 1
        elif name == "disconnect":
            plan.disconnect_after = _count(after or arg or "1", "disconnect@")
        elif name == "malformed":
            plan.malformed_after = _count(after or arg or "1", "malformed@")
        elif name == "slow_start":
            plan.slow_start_s = _num(arg, "slow_start") if arg else 1.0
        else:
            raise ValueError(
                f"{raw.strip()!r}: unknown fault; expected error=STATUS, 429=SECONDS, stall=S@N, "
                "disconnect@N, malformed@N or slow_start=S"
            )
    return plan


class FaultDecider:
    """Seeded per-request fault decisions from ``[faults]``; the i-th request always gets the same."""

    def __init__(self, config: FaultConfig, seed: int = 0) -> None:
        self.config = config
        self._rng = np.random.default_rng([config.seed, seed])
        self._rates = np.array(
            [
                config.error_rate,
                config.rate_limit_rate,
                config.stall_rate,
                config.disconnect_rate,
                config.malformed_rate,
                config.slow_start_rate,
            ]
        )
        self.active = bool(self._rates.any())
        self._draws = np.empty((0, 7))
        self._next = 0

    def decide(self) -> FaultPlan | None:
        """The next request's plan (None when nothing is injected); draws a fixed 7 numbers each."""
        if not self.active:
            return None
        if self._next >= len(self._draws):
            self._draws = self._rng.random((1024, 7))
            self._next = 0
        u = self._draws[self._next]
        self._next += 1
        hit = u[:6] < self._rates
        if not hit.any():
            return None
        c = self.config
        plan = FaultPlan(source="config")
        if hit[0]:
            plan.error_status = c.error_statuses[int(u[6] * len(c.error_statuses)) % len(c.error_statuses)]
            return plan
        if hit[1]:
            plan.retry_after_s = c.retry_after_s
            return plan
        if hit[2]:
            plan.stall_s, plan.stall_after = c.stall_s, c.stall_after_tokens
        if hit[3]:
            plan.disconnect_after = c.disconnect_after_tokens
        if hit[4]:
            plan.malformed_after = c.malformed_after_tokens
        if hit[5]:
            plan.slow_start_s = c.slow_start_s
        return plan


@dataclass
class FaultLog:
    """Appends one JSON line per injected fault and counts them by kind."""

    path: Path | None = None
    counts: dict[str, int] = field(default_factory=lambda: {k: 0 for k in FAULT_KINDS})

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        try:
            self._handle = open(self.path, "a", buffering=1) if self.path else None  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise TargetError(
                f"{self.path}: cannot open the fault log ({exc.strerror}): expected a writable file"
            ) from None

    def log(self, request_id: str, kind: str, params: dict[str, Any], client_request_id: str | None = None) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self._handle is None:
            return
        line = json.dumps(
            {
                "time": round(time.time(), 6),
                "request_id": request_id,
                "client_request_id": client_request_id,
                "kind": kind,
                "params": params,
            },
            sort_keys=True,
        )
        with self._lock:
            self._handle.write(line + "\n")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
