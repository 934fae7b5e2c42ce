"""The run catalog: every run and plan directory found under some roots, in one local DuckDB file.

``Catalog.index(roots)`` walks the roots for run directories (a ``manifest.json`` beside a requests table) and
plan directories (a ``plan.json``), and records for each its identity (package versions, engine, model, GPU,
scenario, trace and settings hashes), state and headline figures per class (``headline``). A directory is
read again only when its signature changed: the size, modification and status-change times of its manifest and
of every part file of its requests table. The catalog holds pointers and summaries, never copies of the Parquet, and can
be rebuilt from the directories at any time (delete the file, index again). A directory indexed before and now
missing (moved or deleted) is marked ``present = false`` and reported, not an error.

Deeper questions go to the Parquet itself, in place, with DuckDB (``docs/runs.md`` has examples).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from loadgen.plan.compare import identity_of
from loadgen.plan.files import PLAN_FILE, REGION_FILE
from loadgen.rundir.io import read_run_manifest
from loadgen.rundir.manifest import Manifest
from loadgen.rundir.schema import MANIFEST_FILE, REQUESTS_FILE
from loadgen.util.errors import LoadgenError, RunDirError
from loadgen.util.jsonfile import read_json_object

from .headline import HEADLINE_COLUMNS, HEADLINE_VERSION, headline_figures

__all__ = ["CATALOG_ENV", "RUN_COLUMNS", "Catalog", "IndexReport", "default_catalog_path"]

#: Environment variable naming the catalog file (default: ``$XDG_CACHE_HOME/loadgen/catalog.duckdb``).
CATALOG_ENV = "LOADGEN_CATALOG"
#: The catalog's layout and figures (``headline.HEADLINE_VERSION``): a catalog of another version has every
#: directory read again at its next index, and until then list and show say so.
_SCHEMA_VERSION = HEADLINE_VERSION
#: How long a command waits for a catalog another process holds (DuckDB lets one process open a file at a time).
_LOCK_WAIT_S = 60.0

#: The ``runs`` table: one row per run or plan directory (``kind``), keyed by its absolute path.
RUN_COLUMNS: dict[str, str] = {
    "path": "VARCHAR PRIMARY KEY",
    "kind": "VARCHAR",  # run | plan
    "present": "BOOLEAN",
    "signature": "VARCHAR",
    "indexed_utc": "VARCHAR",
    "state": "VARCHAR",
    "run_kind": "VARCHAR",  # measured | simulated | imported (runs)
    "started_utc": "VARCHAR",
    "loadgen_version": "VARCHAR",
    "python": "VARCHAR",
    "packages": "VARCHAR",  # JSON {name: version}
    "target_kind": "VARCHAR",
    "engine": "VARCHAR",
    "engine_version": "VARCHAR",
    "model": "VARCHAR",
    "gpu": "VARCHAR",
    "cpu_model": "VARCHAR",
    "scenario_name": "VARCHAR",
    "scenario_sha256": "VARCHAR",
    "trace_name": "VARCHAR",
    "trace_sha256": "VARCHAR",
    "trace_seed": "BIGINT",
    "settings_sha256": "VARCHAR",  # sha256 of the run's identity keys under options, target.engine, warm_state
    "requests_recorded": "BIGINT",
    "plan_cell": "VARCHAR",  # JSON, a run inside a plan
    "plan_name": "VARCHAR",  # plans
    "cells": "BIGINT",  # plans: cells recorded in plan.json (each holds its repeats and extensions)
    "region": "VARCHAR",  # plans: region.json's summary line, when written
    "problem": "VARCHAR",  # why a directory could not be read (it stays listed)
}
#: Said of every row by ``list`` and ``show``, from the disk as it is now (not stored): ``present`` (replacing the
#: stored value: the directory is there) and ``current`` (its files are as indexed, by the catalog's version).
LIVE_COLUMNS = ("present", "current")
_CLASS_TYPES = {name: "VARCHAR" if name == "request_class" else "BIGINT" for name in HEADLINE_COLUMNS[:4]}
_CLASS_COLUMNS: dict[str, str] = {"path": "VARCHAR"} | {
    name: _CLASS_TYPES.get(name, "DOUBLE") for name in HEADLINE_COLUMNS
}


_ARROW = {"VARCHAR": pa.string(), "BIGINT": pa.int64(), "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_()}
_RUNS_ARROW = pa.schema([(k, _ARROW[v.split()[0]]) for k, v in RUN_COLUMNS.items()])
_CLASSES_ARROW = pa.schema([(k, _ARROW[v]) for k, v in _CLASS_COLUMNS.items()])


def default_catalog_path() -> Path:
    """``$LOADGEN_CATALOG``, else ``$XDG_CACHE_HOME/loadgen/catalog.duckdb`` (``~/.cache`` by default)."""
    if os.environ.get(CATALOG_ENV):
        return Path(os.environ[CATALOG_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "loadgen" / "catalog.duckdb"


@dataclass
class IndexReport:
    """What one ``index`` call did."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    missing: list[str] = field(default_factory=list)  # indexed before, gone now (moved or deleted)
    problems: list[str] = field(default_factory=list)  # found but unreadable: path: why
    moved: dict[str, str] = field(default_factory=dict)  # missing path -> where the same run is catalogued now

    def summary(self) -> str:
        text = f"{self.added} added, {self.updated} updated, {self.unchanged} unchanged"
        if self.missing:
            text += (
                f", {len(self.missing)} missing ({len(self.moved)} moved, {len(self.missing) - len(self.moved)} "
                "deleted or out of reach; kept with present = false)"
            )
        if self.problems:
            text += f", {len(self.problems)} unreadable (listed with their problem)"
        return text


def _stat_text(name: str, st: os.stat_result) -> str:
    return f"{name}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _stat_sig(path: Path) -> str:
    return _stat_text(path.name, path.stat())


def _table_sig(table: Path) -> str:
    """A table's stat and, when it is a directory of parts, every entry's in name order."""
    st = os.stat(table)
    if not stat.S_ISDIR(st.st_mode):
        return _stat_text(table.name, st)
    with os.scandir(table) as entries:
        parts = sorted((e.name, e.stat(follow_symlinks=True)) for e in entries)
    return "|".join([_stat_text(table.name, st), *(_stat_text(name, part) for name, part in parts)])


def _signature(directory: Path, kind: str) -> str:
    """What the catalog reads of a directory, each file by size, mtime and ctime: changes when any of it does.

    Every part file of the requests table counts, not only the table's directory: a part rewritten in place (same
    name) leaves the directory's mtime as it was, and one rewritten to the same size with its mtime set back
    (``os.utime``) still moves its ctime, which no one can set. The manifest's own stat covers what it records."""
    if kind == "plan":
        names = [directory / PLAN_FILE, directory / REGION_FILE]
        return "|".join(_stat_sig(p) for p in names if p.exists())
    return f"{_stat_sig(directory / MANIFEST_FILE)}|{_table_sig(directory / REQUESTS_FILE)}"


def _walk(roots: Iterable[Path]) -> Iterator[tuple[Path, str]]:
    """(directory, "run" | "plan") under the roots, without descending into a run's tables."""
    for root in roots:
        if not root.is_dir():
            raise RunDirError(f"{root}: not a directory: expected a directory holding run or plan directories")
        for here, dirs, files in os.walk(root):
            path = Path(here)
            if PLAN_FILE in files:
                yield path.resolve(), "plan"
            if MANIFEST_FILE in files and (REQUESTS_FILE in dirs or REQUESTS_FILE in files):
                yield path.resolve(), "run"
                dirs[:] = [d for d in dirs if not d.endswith(".parquet")]
            dirs.sort()


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, default=str)


def _settings_sha256(manifest: Manifest) -> str:
    ident = identity_of(manifest)
    keys = {k: v for k, v in ident.items() if k.startswith(("options", "target.engine", "warm_state"))}
    return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()


def _gpu(manifest: Manifest) -> str | None:
    gpus = manifest.host.gpus if manifest.host else []
    names = [str(g.get("name")) for g in gpus if isinstance(g, dict) and g.get("name")]
    return f"{len(names)}x {names[0]}" if names else None


def _run_row(path: Path, manifest: Manifest) -> dict[str, Any]:
    harness, engine, target = manifest.harness, manifest.target.engine, manifest.target
    return {
        "state": manifest.state,
        "run_kind": manifest.run_kind,
        "started_utc": manifest.started_utc,
        "loadgen_version": harness.version if harness else None,
        "python": harness.python if harness else None,
        "packages": _json(harness.packages if harness else None),
        "target_kind": target.kind,
        "engine": engine.name if engine else None,
        "engine_version": engine.version if engine else None,
        "model": target.model,
        "gpu": _gpu(manifest),
        "cpu_model": manifest.host.cpu_model if manifest.host else None,
        "scenario_name": manifest.scenario.name if manifest.scenario else None,
        "scenario_sha256": manifest.scenario.sha256 if manifest.scenario else None,
        "trace_name": manifest.trace.name if manifest.trace else None,
        "trace_sha256": manifest.trace.sha256 if manifest.trace else None,
        "trace_seed": manifest.trace.seed if manifest.trace else None,
        "settings_sha256": _settings_sha256(manifest),
        "requests_recorded": manifest.requests_recorded,
        "plan_cell": _json(manifest.plan_cell),
    }


def _plan_row(path: Path) -> dict[str, Any]:
    state = read_json_object(path / PLAN_FILE, "plan state")
    region = read_json_object(path / REGION_FILE, "plan region") if (path / REGION_FILE).exists() else None
    plan: dict[str, Any] = state["plan"] if isinstance(state.get("plan"), dict) else {}
    scenario: dict[str, Any] = state["scenario"] if isinstance(state.get("scenario"), dict) else {}
    harness: dict[str, Any] = state["harness"] if isinstance(state.get("harness"), dict) else {}
    cells = state.get("cells")
    return {
        "state": str(state.get("status") or "running"),
        "started_utc": state.get("created_utc"),
        "loadgen_version": harness.get("version"),
        "python": harness.get("python"),
        "packages": _json(harness.get("packages")),
        "scenario_name": scenario.get("name"),
        "scenario_sha256": scenario.get("sha256"),
        "settings_sha256": state.get("plan_sha256"),
        "plan_name": str(plan.get("name")) if plan.get("name") is not None else None,
        "cells": len(cells) if isinstance(cells, dict) else None,
        "region": _json({"cells_used": region.get("cells_used"), "runs_used": region.get("runs_used")})
        if region
        else None,
    }


def _on_disk_signature(directory: Path, kind: str) -> str | None:
    try:
        return _signature(directory, kind)
    except OSError:
        return None


def _connect(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    """Open the catalog file, waiting up to ``_LOCK_WAIT_S`` while another process holds it (two `runs index`
    at once, or `runs list` during one: DuckDB lets one process open a file at a time)."""
    deadline = time.monotonic() + _LOCK_WAIT_S
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.Error as exc:
            text = _first_line(exc)
            if "lock" not in text.lower():
                raise RunDirError(f"{path}: cannot open the run catalog: {text}") from exc
            if time.monotonic() >= deadline:
                raise RunDirError(
                    f"{path}: the run catalog stayed in use by another process for {_LOCK_WAIT_S:.0f} s ({text}): "
                    "expected it free (is another `loadgen runs index` still running?)"
                ) from exc
            time.sleep(0.1)


class Catalog:
    """One DuckDB catalog file: ``with Catalog(path) as cat: cat.index([root]); cat.list("engine = 'x'")``."""

    def __init__(self, path: Path | str | None = None, *, read_only: bool = False) -> None:
        self.path = Path(path) if path is not None else default_catalog_path()
        if read_only and not self.path.exists():
            raise RunDirError(f"{self.path}: no run catalog: expected one made by `loadgen runs index DIR`")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        try:
            self.db = _connect(self.path, read_only)
            self.version = self._check(read_only)
            if not read_only:
                self._create()
        except BaseException as exc:
            if new:  # a catalog this call began (a full disk): no empty file to be refused later as "not valid"
                self._remove_unfinished()
            elif getattr(self, "db", None) is not None:
                self.db.close()
            if isinstance(exc, duckdb.Error):
                raise RunDirError(f"{self.path}: cannot open the run catalog: {_first_line(exc)}") from exc
            raise

    def _remove_unfinished(self) -> None:
        """Close and delete a catalog file (and its write-ahead log) this call created and could not finish."""
        db = getattr(self, "db", None)
        if db is not None:
            with contextlib.suppress(duckdb.Error):
                db.close()
        for path in (self.path, self.path.with_name(self.path.name + ".wal")):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    def _check(self, read_only: bool) -> str | None:
        """The catalog's schema version (None: a new file); a DuckDB file that is no run catalog is refused, never
        written into."""
        tables = {t for (t,) in self.db.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if not tables and not read_only:
            return None
        if not {"runs", "classes", "catalog_info"} <= tables:
            raise RunDirError(
                f"{self.path}: not a run catalog (tables: {', '.join(sorted(tables)) or 'none'}): expected a file "
                "made by `loadgen runs index DIR`, or a new path"
            )
        row = self.db.execute("SELECT value FROM catalog_info WHERE key = 'schema_version'").fetchone()
        return str(row[0]) if row else None

    def _create(self) -> None:
        if self.version is not None and self.version != str(_SCHEMA_VERSION):
            self.db.execute("UPDATE runs SET signature = NULL")  # every directory is read again by this index
        runs = ", ".join(f"{k} {v}" for k, v in RUN_COLUMNS.items())
        classes = ", ".join(f"{k} {v}" for k, v in _CLASS_COLUMNS.items())
        self.db.execute(f"CREATE TABLE IF NOT EXISTS runs ({runs})")
        self.db.execute(f"CREATE TABLE IF NOT EXISTS classes ({classes})")
        self.db.execute("CREATE TABLE IF NOT EXISTS catalog_info (key VARCHAR PRIMARY KEY, value VARCHAR)")
        self.db.execute("INSERT OR REPLACE INTO catalog_info VALUES ('schema_version', ?)", [str(_SCHEMA_VERSION)])

    # ---- indexing ----------------------------------------------------------------------------------
    def index(self, roots: Iterable[Path | str]) -> IndexReport:
        """Index every run and plan directory under ``roots``; unchanged ones are not read again."""
        paths = [Path(r) for r in roots]
        # a row is read again when its files changed, when it was marked missing (it is back), and while its run
        # was still running when read (its writer may have died since without touching the files)
        known = {
            path: (sig if present and state != "running" else None)
            for path, sig, present, state in self.db.execute(
                "SELECT path, signature, present, state FROM runs"
            ).fetchall()
        }
        report, seen = IndexReport(), set()
        rows: list[dict[str, Any]] = []
        class_rows: list[tuple[Any, ...]] = []
        for directory, kind in _walk(paths):
            key = str(directory)
            if not _utf8(key):  # a catalog path is text: such a directory cannot be stored, nor named in --where
                report.problems.append(f"{_shown(key)}: its path is not UTF-8 text: expected one (rename it)")
                continue
            seen.add(key)
            try:
                sig = _signature(directory, kind)
            except OSError as exc:  # vanished while walking
                report.problems.append(f"{key}: {exc.strerror or exc}")
                continue
            if known.get(key) == sig:
                report.unchanged += 1
                continue
            row, headlines = self._read(directory, kind, report)
            rows.append({"path": key, "kind": kind, "present": True, "signature": sig} | row)
            class_rows += [(key, *(getattr(h, c) for c in HEADLINE_COLUMNS)) for h in headlines]
            if key in known:
                report.updated += 1
            else:
                report.added += 1
        try:
            self._store(rows, class_rows)
        except duckdb.Error as exc:  # a full disk at commit: the transaction is rolled back, the rows are as before
            with contextlib.suppress(duckdb.Error):
                self.db.execute("ROLLBACK")
            raise RunDirError(
                f"{self.path}: cannot write the run catalog ({_first_line(exc)}): nothing of this index was recorded"
            ) from None
        try:
            self._mark_missing(paths, seen, report)
        except duckdb.Error as exc:
            raise RunDirError(
                f"{self.path}: cannot write the run catalog ({_first_line(exc)}): {len(rows)} directories were "
                "recorded, the ones gone were not marked missing"
            ) from None
        return report

    def _read(self, directory: Path, kind: str, report: IndexReport) -> tuple[dict[str, Any], list[Any]]:
        """The row and headline figures of a directory; what cannot be read is its ``problem``, and a run whose
        manifest reads but whose requests do not keeps its identity (it is still found by engine, model ...)."""
        row: dict[str, Any] = {}
        try:
            if kind == "plan":
                return _plan_row(directory), []
            row = _run_row(directory, read_run_manifest(directory))  # a dead writer's run is killed, not running
            return row, headline_figures(directory)
        except (LoadgenError, OSError, ValueError) as exc:
            report.problems.append(f"{directory}: {exc}")
            return row | {"problem": str(exc)}, []

    def _store(self, rows: list[dict[str, Any]], class_rows: list[tuple[Any, ...]]) -> None:
        """Replace the rows of these paths, in one transaction (Arrow tables: DuckDB's fast path)."""
        if not rows:
            return
        now = datetime.now(UTC).isoformat(timespec="seconds")
        runs = pa.Table.from_pylist([r | {"indexed_utc": now} for r in rows], schema=_RUNS_ARROW)
        classes = pa.Table.from_pylist([dict(zip(_CLASS_COLUMNS, row)) for row in class_rows], schema=_CLASSES_ARROW)
        self.db.register("new_runs", runs)
        self.db.register("new_classes", classes)
        try:
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM classes WHERE path IN (SELECT path FROM new_runs)")
            self.db.execute("DELETE FROM runs WHERE path IN (SELECT path FROM new_runs)")
            self.db.execute(f"INSERT INTO runs SELECT {', '.join(RUN_COLUMNS)} FROM new_runs")
            self.db.execute(f"INSERT INTO classes SELECT {', '.join(_CLASS_COLUMNS)} FROM new_classes")
            self.db.execute("COMMIT")
        finally:
            self.db.unregister("new_runs")
            self.db.unregister("new_classes")

    def _mark_missing(self, roots: list[Path], seen: set[str], report: IndexReport) -> None:
        """Rows whose directory is gone (under the indexed roots and not found, or anywhere and not on disk):
        present = false (kept, reported)."""
        prefixes = tuple(str(r.resolve()).rstrip("/") + "/" for r in roots)
        for (path,) in self.db.execute("SELECT path FROM runs WHERE present").fetchall():
            if path in seen:
                continue
            if path.startswith(prefixes) or str(path) + "/" in prefixes or not Path(path).exists():
                report.missing.append(path)
        if report.missing:
            self.db.executemany("UPDATE runs SET present = false WHERE path = ?", [(p,) for p in report.missing])
            report.moved = self._moved(report.missing)

    def _moved(self, missing: list[str]) -> dict[str, str]:
        """Missing path -> the present path of the same run (same kind, start instant, settings and trace hashes;
        a copy elsewhere matches too, so: where it is catalogued now)."""
        self.db.register("missing_paths", pa.table({"path": missing}))
        try:
            pairs = self.db.execute(
                """SELECT m.path, min(p.path) FROM runs m JOIN missing_paths USING (path)
                   JOIN runs p ON p.present AND p.kind = m.kind AND p.started_utc = m.started_utc
                    AND p.settings_sha256 IS NOT DISTINCT FROM m.settings_sha256
                    AND p.trace_sha256 IS NOT DISTINCT FROM m.trace_sha256
                   WHERE m.started_utc IS NOT NULL GROUP BY m.path"""
            ).fetchall()
        finally:
            self.db.unregister("missing_paths")
        return dict(pairs)

    # ---- queries -----------------------------------------------------------------------------------
    def _live(self) -> None:
        """The temporary table ``live``: per row, ``present`` and ``current`` as the disk says now (LIVE_COLUMNS)."""
        same_version = self.version == str(_SCHEMA_VERSION)
        rows = self.db.execute("SELECT path, kind, signature FROM runs").fetchall()
        table = pa.table(
            {
                "path": [path for path, _, _ in rows],
                "present": [Path(path).is_dir() for path, _, _ in rows],
                "current": [same_version and _on_disk_signature(Path(path), kind) == sig for path, kind, sig in rows],
            },
            schema=pa.schema([("path", pa.string()), ("present", pa.bool_()), ("current", pa.bool_())]),
        )
        self.db.register("live_rows", table)
        self.db.execute("CREATE OR REPLACE TEMP TABLE live AS SELECT * FROM live_rows")
        self.db.unregister("live_rows")

    def _runs_now(self) -> str:
        """``runs`` with its ``present`` and ``current`` from the disk as it is now (what --where sees)."""
        self._live()
        return "(SELECT r.* REPLACE (l.present AS present), l.current FROM runs r JOIN live l USING (path)) AS runs"

    def rows(self, where: str | None = None, *, limit: int | None = None) -> list[dict[str, Any]]:
        """Rows of ``runs`` (newest first) matching the SQL condition ``where`` over its columns, with ``present``
        and ``current`` as the disk says now."""
        sql = (
            f"SELECT * FROM {self._runs_now()}"
            + (f" WHERE {where}" if where else "")
            + " ORDER BY started_utc DESC NULLS LAST, path"
        )
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self._dicts(sql, where)

    def classes(self, path: str) -> list[dict[str, Any]]:
        """The headline rows of one run, per class then ``overall``."""
        return self._dicts(
            "SELECT * FROM classes WHERE path = ? ORDER BY request_class = 'overall', request_class", None, [path]
        )

    def find(self, key: str) -> dict[str, Any]:
        """One row by path (absolute or relative to here) or by a unique suffix of its path; ``present`` says
        whether its directory is on disk now. A directory on disk that is not catalogued is refused, never
        matched by suffix to another run of the same name."""
        if not key.strip("/") or not _utf8(key):
            raise RunDirError(
                f"runs show '{_shown(key)}': expected a run's path or the end of one, as UTF-8 text (loadgen runs list)"
            )
        here = Path(key).resolve()
        runs = self._runs_now()
        exact = self._dicts(f"SELECT * FROM {runs} WHERE path = ?", None, [str(here)])
        if exact:
            return exact[0]
        if here.exists():
            raise RunDirError(
                f"runs show {key}: {here} is not in the catalog: expected a catalogued run (loadgen runs index {key})"
            )
        # an end of a path is whole components: "isb-s1" is .../isb-s1, never .../ws-isb-s1 (nor a LIKE pattern)
        end = "/" + key.strip("/")
        matches = self._dicts(f"SELECT * FROM {runs} WHERE ends_with(path, ?) ORDER BY path", None, [end])
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise RunDirError(
                f"runs show {key}: no catalogued run matches: expected a path or a unique end of one (loadgen runs list)"
            )
        shown = ", ".join(m["path"] for m in matches[:5]) + (f" (+{len(matches) - 5} more)" if len(matches) > 5 else "")
        raise RunDirError(
            f"runs show {key}: {len(matches)} catalogued runs match ({shown}): expected a unique end of a path"
        )

    def _dicts(self, sql: str, where: str | None, params: list[Any] | None = None) -> list[dict[str, Any]]:
        try:
            cur = self.db.execute(sql, params or [])
        except duckdb.Error as exc:
            text = str(exc).splitlines()[0]
            raise RunDirError(f"--where {where!r}: {text}: expected an SQL condition over the runs columns") from exc
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]


def _utf8(text: str) -> bool:
    """False for a name the file system gave as undecodable bytes (Python's surrogate escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(text: str) -> str:
    """``text`` printable whatever bytes it holds (undecodable ones as \\xNN)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
