"""Which files a run reads: the inputs a user names (files, folders, globs), each a report or an export."""

from __future__ import annotations

import glob
from pathlib import Path

from ..errors import BadInputError, UsageError

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
EXPORT_DIR_SUFFIXES = ("_pqtdir", ".parquetdir")
# the exports looked for beside a report X.nsys-rep, in the order preferred (Parquet reads fastest)
EXPORTS_BESIDE = (*EXPORT_DIR_SUFFIXES, ".sqlite")


def input_kind(path: Path) -> str | None:
    name = path.name
    if path.is_dir():
        if name.endswith(EXPORT_DIR_SUFFIXES) or (path / "StringIds.parquet").exists():
            return "parquetdir"
        return None
    if name.endswith(REPORT_SUFFIXES):
        return "report"
    if name.endswith(".sqlite"):
        return "sqlite"
    return None


def expand_inputs(inputs: list[str]) -> list[Path]:
    """Files, folders and globs -> the list of rank inputs, one per report. A report and its exports beside
    it (same name) count once, as the report: `open_source` decides which of them is read."""
    if not inputs:
        raise UsageError("no inputs given; pass report files, export files or folders holding them")
    found: list[Path] = []
    for raw in inputs:
        matches = [Path(p) for p in sorted(glob.glob(raw))] if glob.has_magic(raw) else [Path(raw)]
        if not matches:
            raise BadInputError(f"{raw}: no file matches this pattern")
        for p in matches:
            if not p.exists():
                raise BadInputError(f"{p}: no such file or folder")
            kind = input_kind(p)
            if kind is not None:
                found.append(p)
            elif p.is_dir():
                inner = [c for c in sorted(p.iterdir()) if input_kind(c) is not None]
                if not inner:
                    raise BadInputError(
                        f"{p}: folder holds no reports (.nsys-rep, .qdrep) or exports (.sqlite, *_pqtdir)"
                    )
                found.extend(inner)
            else:
                raise BadInputError(
                    f"{p}: not a report or export; expected .nsys-rep, .qdrep, .sqlite or a *_pqtdir folder"
                )
    by_stem: dict[tuple[Path, str], Path] = {}
    for p in found:
        stem = report_stem(p)
        key = (p.parent.resolve(), stem)
        prev = by_stem.get(key)
        if prev is None or (input_kind(p) == "report" and input_kind(prev) != "report"):
            by_stem[key] = p
    unique = list(dict.fromkeys(by_stem.values()))
    return sorted(unique, key=lambda x: str(x))


def report_stem(p: Path) -> str:
    name = p.name
    for suffix in (*REPORT_SUFFIXES, *EXPORTS_BESIDE):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
