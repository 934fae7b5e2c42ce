"""The handoff commands' ``--json`` documents as typed results.

``bundle_result`` (``loadgen handoff RUN --out B --json``, schema ``handoff-build``), ``rerun_result``
(``handoff rerun B --out R --json``, ``handoff-rerun``) and ``verify_result`` (``handoff verify B --json``,
``handoff-verify``) give their models; the CLI prints each one's ``document()``, so the output has exactly the
keys the published schema names. A check's ``limit`` and ``observed`` are in its metric's unit (ms for a
``*_ms`` metric, a share 0..1 for ``error_share`` and ``kv_cache_saturated``, a count for ``preemptions``),
a failure counted as infinite written ``"inf"``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from loadgen.util.resultmodel import ResultModel

from .bundle import BundleInfo
from .findings import AppliedChange, Experiment, FailedCheck, RerunCheck
from .rerun import RerunResult
from .verify import VerifyResult

__all__ = [
    "HANDOFF_BUNDLE_SCHEMA_VERSION",
    "HANDOFF_RERUN_SCHEMA_VERSION",
    "HANDOFF_VERIFY_SCHEMA_VERSION",
    "BundleDocument",
    "RerunDocument",
    "VerifyDocument",
    "bundle_result",
    "rerun_result",
    "verify_result",
]

#: ``handoff ... --json``'s ``version``.
HANDOFF_BUNDLE_SCHEMA_VERSION = 1
#: ``handoff rerun ... --json``'s ``version``.
HANDOFF_RERUN_SCHEMA_VERSION = 1
#: ``handoff verify ... --json``'s ``version``.
HANDOFF_VERIFY_SCHEMA_VERSION = 1


class BundleDocument(ResultModel):
    """A handoff bundle built: where it is, the run it came from, what failed and the proposed experiment."""

    kind: Literal["loadgen.handoff_bundle"]
    version: int = Field(description=f"the schema version ({HANDOFF_BUNDLE_SCHEMA_VERSION})")
    bundle: str = Field(description="the bundle directory")
    tarball: str = Field(description="the bundle's .tar.gz")
    run_dir: str = Field(description="the run the bundle was built from")
    failures: list[FailedCheck]
    experiment: Experiment


class ErrorKinds(ResultModel):
    """Failed requests by error kind (http_429, timeout, ...: a count each), kinds with none left out."""

    original: dict[str, int]
    rerun: dict[str, int]


class RerunDocument(ResultModel):
    """A bundle rerun: the new run, whether the failure reproduced, each failing check re-measured."""

    kind: Literal["loadgen.handoff_rerun"]
    version: int = Field(description=f"the schema version ({HANDOFF_RERUN_SCHEMA_VERSION})")
    run_dir: str = Field(description="the rerun's run directory")
    reproduced: bool | None = Field(description="null: nothing had failed in the original run")
    checks: list[RerunCheck]
    experiment_applied: AppliedChange | None
    error_kinds: ErrorKinds


class VerifyDocument(ResultModel):
    """A bundle checked against its SHA256SUMS."""

    kind: Literal["loadgen.handoff_verify"]
    version: int = Field(description=f"the schema version ({HANDOFF_VERIFY_SCHEMA_VERSION})")
    bundle: str = Field(description="the bundle checked (directory or .tar.gz)")
    ok: bool
    files_checked: int = Field(description="files whose checksum matched (0 when refused)")
    problems: list[str] = Field(description="FILE: what is wrong, the first bad file first")


def bundle_result(info: BundleInfo) -> BundleDocument:
    head = {"kind": "loadgen.handoff_bundle", "version": HANDOFF_BUNDLE_SCHEMA_VERSION}
    body = {"bundle": info.bundle_dir, "tarball": info.tarball, "run_dir": info.run_dir}
    return BundleDocument.from_document(head | body | {"failures": info.failures, "experiment": info.experiment})


def rerun_result(result: RerunResult) -> RerunDocument:
    head = {"kind": "loadgen.handoff_rerun", "version": HANDOFF_RERUN_SCHEMA_VERSION}
    body = {"run_dir": result.run_dir, "reproduced": result.reproduced, "checks": result.checks}
    applied = {"experiment_applied": result.experiment_applied, "error_kinds": result.error_kinds}
    return RerunDocument.from_document(head | body | applied)


def verify_result(bundle: str, result: VerifyResult) -> VerifyDocument:
    head = {"kind": "loadgen.handoff_verify", "version": HANDOFF_VERIFY_SCHEMA_VERSION, "bundle": bundle}
    body = {"ok": result.ok, "files_checked": result.files_checked, "problems": result.problems}
    return VerifyDocument.from_document(head | body)
