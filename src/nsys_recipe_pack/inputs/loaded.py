"""The loaded frames of a cached report export, kept beside it as Arrow files: a warm run reads them memory-mapped
instead of decoding the export's files and string ids again. They are written by the second read of an export, not
by the read that made it: a report looked at once (a cold run) does not pay for them (docs/internals.md, "Reading
exports")."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa

from .frames import Frame, read_arrow_streams, write_arrow_streams
from .readers import ExportSource

LOADED_FORMAT = 8  # bump when Reading.frames or the layout below changes
LOADED_FILE = "frames.arrows"


def loaded_dir(src: ExportSource, needs: set[str]) -> Path | None:
    if src.origin == src.path:
        return None  # only report exports in the pack's cache; user exports are read as they are
    return src.path / f"loaded-v{LOADED_FORMAT}-{'-'.join(sorted(needs))}"


def read_loaded(cache: Path) -> tuple[dict, dict] | None:
    try:
        meta = json.loads((cache / "meta.json").read_text())
        where = meta.pop("frames")
        tables = read_arrow_streams(cache / LOADED_FILE, [(at, size) for _, at, size in where.values()])
        frames = {attr: Frame(table, dtypes) for (attr, (dtypes, _, _)), table in zip(where.items(), tables,
                                                                                      strict=True)}
        return frames, meta
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None

def write_loaded(cache: Path, frames: dict, meta: dict) -> None:
    """All frames of one report in one file of Arrow IPC streams (one open and one map per warm read, where
    a file per frame cost several times more), with where each stream lies in meta.json."""
    tmp = Path(tempfile.mkdtemp(prefix=".loaded-", dir=cache.parent))
    try:
        spans = write_arrow_streams(tmp / LOADED_FILE, [frame.table for frame in frames.values()])
        where = {attr: (frame.dtypes, *span) for (attr, frame), span in zip(frames.items(), spans, strict=True)}
        (tmp / "meta.json").write_text(json.dumps({**meta, "frames": where}))
        try:
            os.rename(tmp, cache)
        except OSError:  # another process wrote it first: theirs is the same
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
