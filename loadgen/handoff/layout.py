"""The names of a handoff bundle's files, defined once for the builder, the verifier and the rerun."""

from __future__ import annotations

__all__ = [
    "BUNDLE_KIND",
    "CONTRACT_DIR",
    "CONTRACT_RESULT",
    "ENGINE",
    "EXPERIMENT",
    "FAILURE",
    "IDENTITY",
    "MANIFEST",
    "NO_CASES",
    "OBSERVED",
    "README",
    "RUNTIME",
    "SCENARIO",
    "SUMS_FILE",
    "TRACE",
    "WORKLOAD",
]

BUNDLE_KIND = "loadgen.handoff_bundle"
SUMS_FILE = "SHA256SUMS"
README = "README.md"
IDENTITY = "identity.json"
WORKLOAD = "workload.json"
SCENARIO = "scenario.toml"
TRACE = "trace.parquet"
RUNTIME = "runtime.json"
ENGINE = "engine.toml"
CONTRACT_DIR = "contract"
CONTRACT_RESULT = "contract_result.json"  # inside CONTRACT_DIR
NO_CASES = "NONE.txt"  # inside CONTRACT_DIR, when the scenario names no behaviour cases
FAILURE = "failure.json"
EXPERIMENT = "experiment.json"
OBSERVED = "observed.json"
MANIFEST = "manifest.json"  # the source run's manifest, copied
