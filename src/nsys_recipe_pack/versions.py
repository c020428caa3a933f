"""Which Nsight Systems made a report, read from the .nsys-rep/.qdrep file itself, without nsys.

An nsys refuses reports made by a newer release, and for some (2025.3.1 reports under 2023.4) it fails with
a protobuf parse error that reads like a corrupt file. Knowing the report's version up front lets the pack
say what is wrong, and read an export beside the report instead.

Where the version lies (seen in reports made by 2020.5.1, 2022.2.1, 2023.4.4, 2025.3.1 and 2025.5.1):
- the file ends with a 16-byte trailer: the offset of a section table (uint64, little-endian), then the
  8 bytes `U3w[END]`;
- the section table is a protobuf message of repeated entries (field 1) {1: name, 2: offset, 3: size};
- the section named `UI Data` is a protobuf message whose field 6 (field 7 and 21 in most releases) is
  the version as text, `2025.5.1.121-255136380782v0` or `2025.3.1.0`;
- from 2023.x on the text header line also carries it, `NVIDIA Tegra Profiler Report 2023@4@4@54-...v0.`
  (`Report 1.` in 2020-2022, a build number in 2025.3.1): used only when the trailer gives nothing.
Only the trailer, the section table and that one section are read (a few hundred bytes).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TRAILER_MAGIC = b"U3w[END]"
HEADER_MAGIC = b"NVIDIA Tegra Profiler Report "
INFO_SECTION = b"UI Data"
VERSION_FIELDS = (6, 7, 21)  # in the order tried
MAX_TABLE = 1 << 16  # a section table is about 200 bytes; more means this is not one
MAX_INFO = 1 << 20  # the info section is under 1 KiB
VERSION_RE = re.compile(rb"^(\d{4})\.(\d{1,3})\.(\d{1,3})(?:\.(\d{1,9}))?(?![\d.])")
HEADER_VERSION_RE = re.compile(rb"^(\d{4})@(\d{1,3})@(\d{1,3})@(\d{1,9})(?![\d@])")


def report_version(path: str | Path) -> str | None:
    """The version of Nsight Systems that made this report, as `2025.5.1.121`; None when it cannot be told
    (not a report, truncated, a layout not seen before). Never raises."""
    try:
        with open(path, "rb") as fh:
            return _from_trailer(fh) or _from_header(fh)
    except (OSError, ValueError, IndexError):
        return None


def _from_trailer(fh) -> str | None:
    size = fh.seek(0, os.SEEK_END)
    if size < 32:
        return None
    fh.seek(size - 16)
    tail = fh.read(16)
    if tail[8:] != TRAILER_MAGIC:
        return None
    at = int.from_bytes(tail[:8], "little")
    if not 0 < at <= size - 16 or size - 16 - at > MAX_TABLE:
        return None
    fh.seek(at)
    for entry in _fields(fh.read(size - 16 - at), 1):
        if not isinstance(entry, bytes):
            continue
        name, offset, length = (next(iter(_fields(entry, f)), None) for f in (1, 2, 3))
        if name != INFO_SECTION or not isinstance(offset, int) or not isinstance(length, int):
            continue
        if not 0 <= offset < offset + length <= at or length > MAX_INFO:
            return None
        fh.seek(offset)
        info = fh.read(length)
        for field in VERSION_FIELDS:
            for value in _fields(info, field):
                m = VERSION_RE.match(value) if isinstance(value, bytes) else None
                if m:
                    return _join(m)
        return None
    return None


def _from_header(fh) -> str | None:
    fh.seek(0)
    head = fh.read(len(HEADER_MAGIC) + 64)
    if not head.startswith(HEADER_MAGIC):
        return None
    m = HEADER_VERSION_RE.match(head[len(HEADER_MAGIC):])
    return _join(m) if m else None


def _join(m: re.Match) -> str:
    return ".".join(g.decode() for g in m.groups() if g is not None)


def _fields(buf: bytes, wanted: int):
    """The values of one field number of a protobuf message: ints for varints, bytes for length-delimited.
    Stops at the first malformed byte (what was read before it still counts)."""
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            length, i = _varint(buf, i)
            if i + length > n:
                return
            value, i = buf[i:i + length], i + length
        elif wire in (1, 5):
            value, i = None, i + (8 if wire == 1 else 4)
        else:
            return
        if field == wanted and i <= n:
            yield value


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while shift < 64:
        byte = buf[i]  # IndexError past the end: the caller gives up
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7
    raise ValueError("varint too long")


def version_key(version: str | None) -> tuple[int, int, int] | None:
    """(year, release, patch) of a version string such as `2023.4.4.54` or `2025.3.1.0-hash`."""
    m = VERSION_RE.match((version or "").encode())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def newer_than(report: str | None, nsys: str | None) -> bool:
    """Whether a report of version `report` is from a later release than `nsys` (so that nsys cannot read it).
    Builds of one release are not told apart; unknown versions are never newer."""
    a, b = version_key(report), version_key(nsys)
    return a is not None and b is not None and a > b
