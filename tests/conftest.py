"""Shared test fixtures."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from loadgen.targets import launch_sim_server

# Property tests assert laws, never speed: no per-example deadline and no "too slow" health check, which
# both measure wall time and fail on a loaded 2-core machine (seen: a 200 ms deadline beside two busy loops).
settings.register_profile("loadgen", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("loadgen")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/shared_paths.py


@pytest.fixture
def sim_server():
    """Factory: ``sim = sim_server("instant", "--seed", "1")`` starts a live simulated server
    (a real subprocess on loopback) that is stopped when the test ends."""
    with contextlib.ExitStack() as stack:

        def start(engine: str = "interactive-small-batch", *extra_args: str, env: dict[str, str] | None = None):
            return stack.enter_context(launch_sim_server(engine, *extra_args, env=env))

        yield start


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MB tmpfs (root only); the test is skipped with the reason when it cannot be mounted."""
    from small_disk import mounted_small_disk

    with mounted_small_disk(tmp_path / "small") as where:
        yield where
