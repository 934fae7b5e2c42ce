"""Specialist handoff: the smallest reproducible package for a failed budget, and its verification.

``build_bundle(RUN_OR_PLAN_DIR, OUT)`` writes a directory and ``OUT.tar.gz`` holding the identity of
package, engine and hardware; the workload generator settings and seed (the scenario file and trace
name, never raw prompts); the trace Parquet (token counts and timing only, no text); the runtime
configuration; the expected contract (case files); the failing thresholds with measured value and
sample count; one proposed one-variable experiment; a README saying how to rerun it with one command;
and ``SHA256SUMS``. It states what was observed; it does not prescribe kernel work.
``verify_bundle`` checks a bundle (directory or tar.gz) against its checksums and refuses links and
paths that leave it; ``rerun_bundle`` replays the bundled trace against a target, or against the
simulated engine from the bundled config.

Modules: ``bundle`` (choosing the run, writing the files), ``experiment`` (the one-variable policy),
``readme`` (the README text), ``verify`` (SHA256SUMS, tar.gz, verification), ``rerun``, and ``layout``
(the bundle's file names).
"""

from __future__ import annotations

from typing import Any

from loadgen.util.tomlfile import dumps_toml

from .bundle import BundleInfo, build_bundle, find_run_dirs
from .experiment import propose_experiment
from .layout import SUMS_FILE
from .rerun import RerunResult, rerun_bundle
from .verify import VerifyResult, verify_bundle

__all__ = [
    "SUMS_FILE",
    "BundleInfo",
    "RerunResult",
    "VerifyResult",
    "build_bundle",
    "find_run_dirs",
    "propose_experiment",
    "rerun_bundle",
    "toml_dumps",
    "verify_bundle",
]


def toml_dumps(data: dict[str, Any]) -> str:
    """Kept for existing callers: ``loadgen.util.tomlfile.dumps_toml`` under its old name."""
    return dumps_toml(data, what="TOML data")
