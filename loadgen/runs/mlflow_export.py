"""``loadgen export mlflow RUN_OR_PLAN...``: runs and plans as MLflow runs, read back by MLflow's own client.

Each run directory becomes one MLflow run: its identity keys (``compare``'s ``identity_of``: package versions,
engine and its settings, model, host, scenario and trace hashes) as params; its headline figures per class
(``headline``) as metrics named ``<class>.<figure>``; its small files (manifest, JSON, Markdown, logs under
``MAX_ARTIFACT_BYTES``) plus the HTML report as artifacts. A plan directory becomes a parent MLflow run (the plan's
files as artifacts) with one child run per run directory inside it. Exporting the same directory again, unchanged,
adds nothing (its catalog signature is a tag). Never Parquet: the run directory is the archive.

A run directory that cannot be read (a broken manifest, request rows refused as implausible: what
``runs index`` lists as unreadable) is read before anything is written for it: it is skipped, named with the
reason in ``ExportReport.skipped``, and the others are exported; the CLI then exits 2.

The default store is local: ``sqlite:///mlflow.db`` with artifacts in ``./mlflow-artifacts`` (MLflow 3 put its
plain-file store in maintenance mode). Needs ``pip install 'loadgen[mlflow]'``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.analysis import analyze_run, write_html
from loadgen.plan.compare import identity_of
from loadgen.plan.files import PLAN_FILE, read_plan_state
from loadgen.rundir.manifest import read_manifest
from loadgen.rundir.schema import MANIFEST_FILE
from loadgen.util.errors import LoadgenError, RunDirError

from .catalog import _signature, _walk
from .headline import HEADLINE_COLUMNS, HEADLINE_VERSION, headline_figures

__all__ = ["DEFAULT_TRACKING_URI", "MAX_ARTIFACT_BYTES", "ExportReport", "check_tracking_uri", "export_mlflow"]

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "loadgen"
#: Files of a run directory larger than this are not copied (the Parquet never is).
MAX_ARTIFACT_BYTES = 16 * 1024 * 1024
_ARTIFACT_SUFFIXES = (".json", ".md", ".txt", ".log", ".toml", ".html")
_PARAM_VALUE_MAX = 6000  # MLflow 3's limit on a param value


@dataclass
class ExportReport:
    exported: list[str] = field(default_factory=list)  # "path -> mlflow run id"
    unchanged: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "path: why it could not be read"


#: MLflow's HTTP client retries a refused connection for minutes by default; an unreachable server is one line
#: within seconds (a user's own MLFLOW_HTTP_REQUEST_* settings win).
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
#: Tracking URI schemes MLflow records to; a bare path or file: is its file store, which MLflow 3 refuses to update.
_URI_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc")
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _mlflow() -> Any:
    for name, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    try:
        import mlflow  # deferred: an optional dependency (loadgen[mlflow])
    except ImportError as exc:
        raise LoadgenError("export mlflow: MLflow is not installed: expected `pip install 'loadgen[mlflow]'`") from exc
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its INFO lines ("Creating initial ... tables") on stderr
    return mlflow


def check_tracking_uri(tracking_uri: str) -> None:
    """A URI MLflow can record to, checked before anything is opened: one LoadgenError line otherwise (a bare
    path, file:, a SQLite path that is a directory, in no directory, or a file that is no SQLite database)."""
    scheme = tracking_uri.split(":", 1)[0].split("+", 1)[0] if ":" in tracking_uri else ""  # postgresql+psycopg2
    if scheme not in _URI_SCHEMES:
        raise LoadgenError(
            f"--tracking-uri = {tracking_uri!r:.120}: expected sqlite:///PATH, http(s)://HOST or a database URI "
            "(MLflow 3's file store takes no new runs)"
        )
    db = _sqlite_file(tracking_uri)
    if db is None:
        return
    if db.is_dir() or not db.parent.is_dir():
        problem = "is a directory" if db.is_dir() else "is in no existing directory"
        raise LoadgenError(f"--tracking-uri = {tracking_uri!r:.120}: {db} {problem}: expected an SQLite file")
    if db.is_file() and db.stat().st_size and not _is_sqlite(db):
        raise LoadgenError(f"--tracking-uri = {tracking_uri!r:.120}: {db} is no SQLite database: expected one")


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


def _sqlite_file(tracking_uri: str) -> Path | None:
    return Path(tracking_uri[len("sqlite:///") :]) if tracking_uri.startswith("sqlite:///") else None


def _client(tracking_uri: str, experiment: str) -> tuple[Any, str]:
    """The client and the experiment's id; a SQLite store this call began and could not finish (MLflow's
    schema cut short by a full disk, which MLflow never opens again) is removed."""
    db = _sqlite_file(tracking_uri)
    new = db is not None and not db.exists()
    try:
        mlflow = _mlflow()
        client = mlflow.tracking.MlflowClient(tracking_uri)
        found = client.get_experiment_by_name(experiment)
        if found is not None:
            return client, found.experiment_id
        location = (db.parent.resolve() / "mlflow-artifacts").as_uri() if db is not None else None
        return client, client.create_experiment(experiment, artifact_location=location)
    except BaseException:
        if new and db is not None:
            _remove_store(db)
        raise


def _remove_store(db: Path) -> None:
    """An SQLite store this call created, with its journal files."""
    for path in (db, db.with_name(db.name + "-journal"), db.with_name(db.name + "-wal")):
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def _params(run_dir: Path) -> dict[str, str]:
    ident = identity_of(read_manifest(run_dir))
    return {k[:250]: str(v)[:_PARAM_VALUE_MAX] for k, v in ident.items() if v is not None}


def _metrics(run_dir: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for h in headline_figures(run_dir):
        for name in HEADLINE_COLUMNS[1:]:
            value = getattr(h, name)
            if value is not None:
                out[f"{h.request_class}.{name}"] = float(value)
    return out


def _artifacts(directory: Path) -> list[Path]:
    return sorted(
        p
        for p in directory.iterdir()
        if p.is_file() and p.suffix in _ARTIFACT_SUFFIXES and p.stat().st_size <= MAX_ARTIFACT_BYTES
    )


def _export_signature(directory: Path, kind: str) -> str:
    """The directory's files as the catalog signs them, and the headline figures' version: a run exported with
    figures of an earlier definition is exported again, not left with them as unchanged."""
    return f"{_signature(directory, kind)}|headline-v{HEADLINE_VERSION}"


def _existing(client: Any, experiment_id: str, path: Path, signature: str) -> bool:
    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.`loadgen.path` = '{path}' and tags.`loadgen.signature` = '{signature}'"
    )
    return bool(runs)


@dataclass
class _RunContents:
    """What a run directory exports, read in full before anything is written to the store."""

    params: dict[str, str]
    metrics: dict[str, float]
    analysis: Any


def _read_run(run_dir: Path) -> _RunContents:
    """The run's params, metrics and analysis; a directory that cannot be read raises (as ``runs index`` finds)."""
    return _RunContents(_params(run_dir), _metrics(run_dir), analyze_run(run_dir))


def _log_run(client: Any, experiment_id: str, run_dir: Path, parent: str | None, contents: _RunContents) -> str:
    tags = {"loadgen.path": str(run_dir), "loadgen.kind": "run"}
    if parent:
        tags["mlflow.parentRunId"] = parent
    run = client.create_run(experiment_id, run_name=run_dir.name, tags=tags)
    rid = run.info.run_id
    with _failed_unless_finished(client, rid):
        _log_contents(client, rid, run_dir, contents)
        _finish(client, rid, _export_signature(run_dir, "run"))
    return str(rid)


@contextlib.contextmanager
def _failed_unless_finished(client: Any, rid: str) -> Iterator[None]:
    """An MLflow run cut short (a full disk, a lost server) is marked FAILED when the store still takes it."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            client.set_terminated(rid, status="FAILED")
        raise


def _finish(client: Any, rid: str, signature: str) -> None:
    """The signature tag last: a run that has it is whole, and only a whole one counts as exported before."""
    client.set_tag(rid, "loadgen.signature", signature)
    client.set_terminated(rid)


def _log_contents(client: Any, rid: str, run_dir: Path, contents: _RunContents) -> None:
    mlflow = _mlflow()
    entities = mlflow.entities
    params = [entities.Param(k, v) for k, v in contents.params.items()]
    for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(rid, params=params[i : i + 100])
    metrics = [entities.Metric(k, v, 0, 0) for k, v in contents.metrics.items()]
    for i in range(0, len(metrics), 1000):
        client.log_batch(rid, metrics=metrics[i : i + 1000])
    for path in _artifacts(run_dir):
        client.log_artifact(rid, str(path))
    with tempfile.TemporaryDirectory() as tmp:
        report = write_html(contents.analysis, Path(tmp) / "report.html")
        client.log_artifact(rid, str(report))


def export_mlflow(
    directories: Sequence[Path | str], *, tracking_uri: str = DEFAULT_TRACKING_URI, experiment: str = DEFAULT_EXPERIMENT
) -> ExportReport:
    """Export run and plan directories (see the module docstring); returns what was exported or skipped."""
    check_tracking_uri(tracking_uri)
    kinds = [(directory, _kind(directory)) for directory in (Path(d).resolve() for d in directories)]
    report = ExportReport()
    db = _sqlite_file(tracking_uri)
    new = db is not None and not db.exists()
    with _tracker_errors(tracking_uri, report):
        client, exp = _client(tracking_uri, experiment)  # only once every directory is one: a refusal writes nothing
        for directory, kind in kinds:
            if kind == "plan":
                _export_plan(client, exp, directory, report)
            else:
                _export_one(client, exp, directory, None, report)
    if new and db is not None and not report.exported:  # every directory skipped: no empty store is left behind
        _remove_store(db)
    return report


@contextlib.contextmanager
def _tracker_errors(tracking_uri: str, report: ExportReport) -> Iterator[None]:
    """A store that fails (a full disk under the SQLite file or artifacts, a lost server) is one line saying what
    was exported before it; a run cut short is FAILED in MLflow and exported again next time."""
    failures: tuple[type[BaseException], ...] = (OSError, _mlflow().exceptions.MlflowException)
    try:
        import sqlalchemy.exc  # MLflow's SQL stores raise its errors unwrapped (absent with mlflow-skinny)

        failures += (sqlalchemy.exc.SQLAlchemyError,)
    except ImportError:
        pass
    try:
        yield
    except failures as exc:
        text = str(exc).strip().splitlines()
        done = f"{len(report.exported)} exported before it" if report.exported else "nothing exported"
        raise LoadgenError(
            f"{tracking_uri}: MLflow could not record ({text[0] if text else type(exc).__name__}); {done}"
        ) from None


def _kind(directory: Path) -> str:
    """``plan`` or ``run``; anything else is one RunDirError line."""
    if (directory / PLAN_FILE).is_file():
        return "plan"
    if (directory / MANIFEST_FILE).is_file():
        return "run"
    raise RunDirError(f"{directory}: neither a run directory nor a plan directory: expected one of them")


def _export_one(client: Any, exp: str, run_dir: Path, parent: str | None, report: ExportReport) -> None:
    if _existing(client, exp, run_dir, _export_signature(run_dir, "run")):
        report.unchanged.append(str(run_dir))
        return
    try:
        contents = _read_run(run_dir)
    except (LoadgenError, ValueError) as exc:  # the catalog's unreadable run: skipped, the others exported
        report.skipped.append(f"{run_dir}: {exc}")
        return
    report.exported.append(f"{run_dir} -> {_log_run(client, exp, run_dir, parent, contents)}")


def _export_plan(client: Any, exp: str, plan_dir: Path, report: ExportReport) -> None:
    signature = _export_signature(plan_dir, "plan")
    if _existing(client, exp, plan_dir, signature):
        report.unchanged.append(str(plan_dir))
        return
    try:  # its plan.json as a resume reads it: a damaged one is skipped before its MLflow run is begun
        read_plan_state(plan_dir / PLAN_FILE)
    except LoadgenError as exc:
        report.skipped.append(f"{plan_dir}: {exc}")
        return
    tags = {"loadgen.path": str(plan_dir), "loadgen.kind": "plan"}
    parent = client.create_run(exp, run_name=plan_dir.name, tags=tags).info.run_id
    with _failed_unless_finished(client, parent):
        for path in _artifacts(plan_dir):
            client.log_artifact(parent, str(path))
        for run_dir, kind in _walk([plan_dir]):
            if kind == "run":
                _export_one(client, exp, run_dir, parent, report)
        _finish(client, parent, signature)
    report.exported.append(f"{plan_dir} -> {parent}")
