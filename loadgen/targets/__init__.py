"""Targets: the one way to turn "sim preset | calibrated engine | vLLM launch | URL" into a ready target.

Every command that measures something goes through this package: ``loadgen plan``, ``practice``,
``bench``, ``handoff rerun``, the contract replay under load, the tests and the benchmarks.

- ``TargetSpec`` / ``open_target``: choose and open one target (``spec``);
- ``Target`` / ``StateResult``: the interface (prepare a warm/cold state, run, check, recover, close);
- ``WorksheetTarget``, ``SimServerTarget``, ``UrlTarget``, ``VllmTarget``: the kinds;
- ``SimServerProcess`` / ``launch_sim_server``: the simulated engine's live server as a child process;
- ``run_driver`` / ``warm_up``: one replay through the driver, and the fixed warm-up set.

Launching a process is defined once, in ``loadgen.util.childproc``; the sim's ready line once, in
``loadgen.sim.ready``.
"""

from __future__ import annotations

from .base import RunRequest, StateResult, Target
from .replay import run_driver, warm_up
from .sim import SimServerHandle, SimServerProcess, SimServerTarget, WorksheetTarget, launch_sim_server
from .spec import TargetSpec, open_target
from .url import UrlTarget
from .vllm import VllmTarget

__all__ = [
    "RunRequest",
    "SimServerHandle",
    "SimServerProcess",
    "SimServerTarget",
    "StateResult",
    "Target",
    "TargetSpec",
    "UrlTarget",
    "VllmTarget",
    "WorksheetTarget",
    "launch_sim_server",
    "open_target",
    "run_driver",
    "warm_up",
]
