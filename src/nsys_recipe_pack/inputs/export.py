"""Exporting reports through nsys into the pack's cache (Arrow or Parquet files, only the tables a recipe needs),
and opening what a run reads: the export of a report, the export beside it, or a user's export."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa

from .. import nsys_tool, versions
from ..errors import BadInputError, MissingToolError
from .discovery import EXPORTS_BESIDE, input_kind, report_stem
from .payloads import TABLE_PATTERN as PAYLOAD_TABLES
from .readers import ALWAYS, FOLDER_SUFFIXES, MPI_PREFIX, TABLES, ExportSource, small_table

# reports up to this size are exported as Arrow files: nsys writes them in about three quarters of the CPU time
# Parquet takes, and they are read back memory-mapped, without decoding; a larger report is exported as
# Parquet, compressed and in row groups, since nsys writes each Arrow table as one batch, which a long capture's
# read would hold whole (bench/RESULTS.md, "Cold runs")
ARROW_EXPORT_MAX_BYTES = 64 << 20


def _report_key(report: Path, nsys: nsys_tool.Nsys) -> str:
    st = report.stat()
    h = hashlib.sha1()
    h.update(f"{report.name}|{st.st_size}|{st.st_mtime_ns}|{nsys.version}".encode())
    with open(report, "rb") as fh:  # a little content, so two different reports never share a key
        h.update(fh.read(65536))
        if st.st_size > 65536:
            fh.seek(-65536, os.SEEK_END)
            h.update(fh.read(65536))
    return h.hexdigest()[:24]


def export_cache_dir() -> Path:
    return nsys_tool.cache_root() / "exports"


def export_entry(report: Path, nsys: nsys_tool.Nsys) -> Path:
    return export_cache_dir() / _report_key(report, nsys)


def _check_report_file(report: Path) -> None:
    size = report.stat().st_size
    if size == 0:
        raise BadInputError(f"{report}: empty file; profile again or copy the report completely")


def export_report(report: Path, tables: list[str], nsys: nsys_tool.Nsys) -> ExportSource:
    """An export of the given tables, cached and reused while the report is unchanged.

    Tables are exported on demand: a later recipe needing more tables adds them to the same entry, in the entry's
    kind of files.
    """
    _check_report_file(report)
    entry = export_entry(report, nsys)
    manifest_path = entry / "manifest.json"
    manifest = _read_manifest(manifest_path)
    if set(tables) <= set(manifest.get("requested", [])):  # the usual warm case: the manifest is replaced whole,
        return ExportSource(entry, _entry_kind(manifest), origin=report)  # so it is read without the lock
    entry.parent.mkdir(parents=True, exist_ok=True)
    with _locked(entry.with_suffix(".lock")):
        manifest = _read_manifest(manifest_path)
        kind = _entry_kind(manifest) if manifest else export_kind(report)
        requested = set(manifest.get("requested", []))
        missing = [t for t in tables if t not in requested]
        if not missing:
            return ExportSource(entry, kind, origin=report)
        entry.mkdir(exist_ok=True)
        # one staging folder per entry, used only under its lock: made inside the try, so a signal at any point
        # leaves none behind, and one a killed run left (SIGKILL, a lost machine) is cleared by the next export
        tmp = staging_dir(entry)
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            out = tmp / "x"
            nsys_tool.run_nsys(nsys, export_args(report, missing, out, kind), report=report)
            for f in out.glob(f"*{FOLDER_SUFFIXES[kind]}") if out.exists() else []:
                os.replace(f, entry / f.name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        manifest = {
            "report": str(report.resolve()),
            "nsys_version": nsys.version,
            "kind": kind,
            "requested": sorted(requested | set(missing)),
        }
        tmp_manifest = entry / ".manifest.json.partial"  # under the lock: a killed run's is overwritten
        tmp_manifest.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp_manifest, manifest_path)
    return ExportSource(entry, kind, origin=report, exported_now=True)


def staging_dir(entry: Path) -> Path:
    """Where nsys writes the tables being added to a cache entry, before they join it."""
    return entry.parent / f".export-{entry.name}"


def export_kind(report: Path) -> str:
    """The kind of files a report is exported to: Arrow up to ARROW_EXPORT_MAX_BYTES, Parquet above."""
    return "arrowdir" if report.stat().st_size <= ARROW_EXPORT_MAX_BYTES else "parquetdir"


def _entry_kind(manifest: dict) -> str:
    return manifest.get("kind", "parquetdir")  # entries written before Arrow exports hold Parquet files


def export_args(report: Path, tables: list[str], out: Path, kind: str = "parquetdir") -> list[str]:
    """The `nsys export` arguments that write these tables of a report (a trailing `*`: every table so named) to a
    folder of files of this kind."""
    patterns = ",".join(f"^{t}$" if not t.endswith("*") else f"^{t[:-1]}.*" for t in tables)
    return ["export", "--type", kind, "--quiet", "true", "--force-overwrite", "true", "--tables", patterns,
            "--output", str(out), str(report)]


def _read_manifest(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def _locked(lock_path: Path):
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


IF_PRESENT = ["PROCESSES"]  # read where an export has them; an export without them is as usable


def table_names(needs: set[str]) -> list[str]:
    # NVTX always: its "rank N" ranges are one of the sources of the rank
    names = [*ALWAYS, *IF_PRESENT, *TABLES["nvtx"]]
    for need in sorted(needs):
        names.extend(TABLES.get(need, {}))
    if "mpi" in needs:
        names.append(MPI_PREFIX + "*")
    if "payload" in needs:
        names.append(PAYLOAD_TABLES)
    return names


def open_source(path: Path, needs: set[str], nsys_path: str | None = None) -> ExportSource:
    """The export to read for one input; `origin` is the file actually read (the report or an export)."""
    kind = input_kind(path)
    if kind == "report":
        beside, why_not = export_beside(path, needs)
        if beside is not None:
            return open_source(beside, needs)
        stale = export_beside(path, needs, older_too=True)[0]  # complete, but older than the report
        nsys = nsys_tool.find_nsys(nsys_path, required=False)
        made_by = versions.report_version(path)
        if nsys is None or versions.newer_than(made_by, nsys.version):  # nsys would fail, some as if corrupt
            if stale is not None:  # nothing else can be read: the export, said so
                src = open_source(stale, needs)
                src.note = (f"read {stale.name} beside it, {_older(stale, path)} than the report: "
                            + ("no nsys was found to export the report" if nsys is None else
                               f"the nsys found ({nsys.version}) cannot read a report made by Nsight Systems "
                               f"{made_by}") + f"; {TOUCH_HINT.format(export=stale.name)}")
                return src
            if nsys is None:
                raise MissingToolError(nsys_tool.not_found_message(path, why_not))
            raise BadInputError(nsys_tool.too_new_message(path, made_by, nsys, why_not))
        src = export_report(path, table_names(needs), nsys)
        if stale is not None:
            src.note = (f"{stale.name} beside it is {_older(stale, path)} than the report, so the report was exported "
                        f"again; {TOUCH_HINT.format(export=stale.name)}")
        return src
    if kind == "sqlite":
        if path.stat().st_size == 0:
            raise BadInputError(f"{path}: empty file; re-export it with `nsys export --type sqlite`")
        return ExportSource(path, "sqlite")
    if kind == "parquetdir":
        return ExportSource(path, "parquetdir")
    raise BadInputError(f"{path}: not a report or export")

TOUCH_HINT = ("if {export} is the report's own export, `touch` it (or copy folders with `cp -a`/`rsync -a`, which keep "
              "modification times) and it is read instead")


def export_beside(report: Path, needs: set[str], older_too: bool = False) -> tuple[Path | None, str]:
    """The export next to a report to read instead of it, else None and why those there do not qualify ("" when
    there are none).

    `nsys profile --stats` and `nsys export` leave one there, and reading it needs no nsys, not even one
    as new as the report. One qualifies when it is a complete export (see `_beside_problem`) and not older
    than the report: a report profiled again under the same name leaves the old export stale (`older_too`: a
    complete one, whatever its age)."""
    stem, why = report_stem(report), []
    for suffix in EXPORTS_BESIDE:
        candidate = report.with_name(stem + suffix)
        if candidate.exists():
            problem = _beside_problem(candidate, report, needs, older_too)
            if problem is None:
                return candidate, ""
            why.append(f"{candidate.name} beside it {problem}")
    return None, "; ".join(why)


def _older(export: Path, report: Path) -> str:
    """How much older an export is than its report, in words."""
    ns = report.stat().st_mtime_ns - _stamp(export).stat().st_mtime_ns
    for unit, size in (("day", 86_400e9), ("h", 3_600e9), ("min", 60e9), ("s", 1e9), ("ms", 1e6)):
        if ns >= size:
            return f"{ns / size:.0f} {unit}{'s' if unit == 'day' and ns >= 1.5 * size else ''} older"
    return "older"


def _stamp(export: Path) -> Path:
    """The file whose modification time dates an export."""
    return export if export.name.endswith(".sqlite") else export / "StringIds.parquet"


def _beside_problem(export: Path, report: Path, needs: set[str], older_too: bool = False) -> str | None:
    """None when this export can stand for the report, else what is wrong with it.

    Complete means a full export (META_DATA_EXPORT present with no table filter: every table the report has is
    there, so a missing one means the trace was not recorded), or else one holding every table the needs name
    (as the exports `nsys recipe` leaves beside reports, made with a table filter and no META_DATA_EXPORT).
    New enough means a modification time not before the report's (its StringIds.parquet for a folder)."""
    sqlite_file = export.name.endswith(".sqlite")
    if export.is_dir() == sqlite_file:
        return "is not an export"
    try:
        if not older_too and _stamp(export).stat().st_mtime_ns < report.stat().st_mtime_ns:
            return f"is {_older(export, report)} than the report"
        tables, filtered = _export_tables(export)
    except (OSError, pa.ArrowException, BadInputError):
        return "is not a readable export"
    if "StringIds" not in tables:
        return "is not an Nsight Systems export"
    if "META_DATA_EXPORT" in tables and not filtered:
        return None
    missing = [t for t in table_names(needs) if not t.endswith("*") and t not in tables and t not in IF_PRESENT]
    return f"lacks {', '.join(missing)}" if missing else None


def _export_tables(path: Path) -> tuple[set[str], bool]:
    """The tables of an export, and whether it was made with a table filter (`nsys export --tables`)."""
    src = ExportSource(path, "sqlite" if path.name.endswith(".sqlite") else "parquetdir")
    try:
        meta = small_table(src, "META_DATA_EXPORT", ["name", "value"])
        return src.tables, any(v for n, v in zip(meta.get("name", []), meta.get("value", []), strict=False)
                               if n == "EXPORT_PARAM_TABLES_TO_EXPORT")
    finally:
        src.close()
