"""NCCL's NVTX payloads: the communicator, its size and this rank's place in it, message sizes and peers, decoded
from `NVTX_EVENTS.binaryData` through the payload schemas NCCL registers (`NVTX_PAYLOAD_SCHEMAS`,
`NVTX_PAYLOAD_SCHEMA_ENTRIES`; NSYS_NOTES.md of the project's shared notes lists them).

A payload's bytes are read as a BLOB, or as text of hexadecimal digits; its schema is the one its event's
`uint64Value` names where that is a registered schema, else the schema of its call: a communicator's creation
(`ncclCommInit*`, `ncclCommSplit`) the one with "No. of ranks", a send or receive the one with "Peer rank", any
reduction the one with "Reduction operation", a broadcast or reduce the one with "Root", any other call the
one with "Message size [bytes]" and fewest entries. Fields are decoded a column at a time, never a row at a time."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .events import event_names
from .frames import Frame, arrow_of, numpy_of, one_array, strings_of
from .readers import ExportSource, StringTable, pid_of

SCHEMAS = "NVTX_PAYLOAD_SCHEMAS"
ENTRIES = "NVTX_PAYLOAD_SCHEMA_ENTRIES"
TABLE_PATTERN = "NVTX_PAYLOAD_SCHEMA*"  # both, for `nsys export --tables` (absent from older releases' exports)
COMM_ID = "NCCL communicator ID"
FIELDS = {"nranks": "No. of ranks", "comm_rank": "Rank", "device": "CUDA device", "bytes": "Message size [bytes]",
          "peer": "Peer rank", "root": "Root"}
# NVTX payload entry types whose width is known: 4-byte and 8-byte integers, sizes and addresses
WIDTH_OF_TYPE = {1: 1, 2: 1, 3: 2, 4: 2, 5: 4, 6: 4, 7: 8, 8: 8, 9: 8, 10: 8, 11: 1, 12: 1, 13: 2, 14: 2, 15: 4,
                 16: 4, 17: 8, 18: 8, 22: 8, 23: 8}
COLUMNS = ["start_ns", "end_ns", "tid", "pid", "call", "comm_id", *FIELDS]
DTYPES = {"start_ns": "int64", "end_ns": "int64", "tid": "int64", "pid": "int64", "call": "object",
          "comm_id": "int64", **{f: "int64" for f in FIELDS}}
MISSING = -1  # a field the event's schema does not carry


def empty() -> Frame:
    arrays = {c: arrow_of(np.zeros(0, np.int64)) for c in COLUMNS if c != "call"}
    arrays["call"] = pa.DictionaryArray.from_arrays(arrow_of(np.zeros(0, np.int32)), strings_of(np.zeros(0, object)))
    return Frame(pa.table({c: arrays[c] for c in COLUMNS}), dict(DTYPES))


def read_payloads(src: ExportSource, strings: StringTable) -> Frame:
    """Every NVTX event with a binary payload NCCL's schemas decode: its time, thread, call name, communicator id
    (its 64 bits as int64) and the fields its schema carries (MISSING where it carries none)."""
    if not (src.has(ENTRIES) and src.has("NVTX_EVENTS") and "binaryData" in src.columns("NVTX_EVENTS")):
        return empty()
    layouts = _layouts(src)
    if not layouts:
        return empty()
    raw = _events_with_payload(src)
    if not raw.num_rows:
        return empty()
    data, offsets, lengths = _bytes_of(one_array(raw.column("binaryData")))
    names = event_names(raw, strings)[:2]
    schema = _schema_of(raw, names, lengths, layouts)
    keep = schema >= 0
    out = {c: np.full(raw.num_rows, MISSING, np.int64) for c in ["comm_id", *FIELDS]}
    for sid in np.unique(schema[keep]).tolist():
        rows = np.flatnonzero(schema == sid)
        for column, (offset, width) in layouts[sid]["fields"].items():
            fits = lengths[rows] >= offset + width
            out[column][rows[fits]] = _integers(data, offsets[rows[fits]] + offset, width)
    start = numpy_of(raw.column("start"), 0).astype(np.int64)
    end = numpy_of(raw.column("end"), 0).astype(np.int64) if "end" in raw.column_names else start
    tid = numpy_of(raw.column("globalTid"), 0).astype(np.int64)
    words, at = names
    arrays = {"start_ns": start, "end_ns": np.where(end > 0, end, start), "tid": tid, "pid": pid_of(tid), **out}
    table = {c: arrow_of(arrays[c][keep]) for c in COLUMNS if c != "call"}
    table["call"] = pa.DictionaryArray.from_arrays(arrow_of(at[keep].astype(np.int32)), strings_of(words))
    return Frame(pa.table({c: table[c] for c in COLUMNS}), dict(DTYPES))


def _layouts(src: ExportSource) -> dict[int, dict]:
    """schemaId -> {"size": payload size, "names": entry names, "fields": column -> (offset, width)}."""
    entries = src.read_arrow(ENTRIES, ["schemaId", "idx", "type", "name", "offset"]).to_pydict()
    sizes = dict(zip(*(src.read_arrow(SCHEMAS, ["schemaId", "payloadSize"]).to_pydict().get(c, [])
                       for c in ("schemaId", "payloadSize")), strict=False)) if src.has(SCHEMAS) else {}
    by_schema: dict[int, list] = {}
    for sid, idx, typ, name, offset in zip(*(entries.get(c, []) for c in ("schemaId", "idx", "type", "name",
                                                                          "offset")), strict=False):
        if sid is not None and name is not None:
            by_schema.setdefault(int(sid), []).append((idx or 0, typ, str(name), offset))
    layouts = {}
    for sid, rows in by_schema.items():
        rows.sort(key=lambda r: r[0])
        size = sizes.get(sid)
        fields, at = {}, 0
        for i, (_, typ, name, offset) in enumerate(rows):
            offset = at if offset is None else int(offset)
            following = rows[i + 1][3] if i + 1 < len(rows) and rows[i + 1][3] is not None else size
            width = WIDTH_OF_TYPE.get(typ) or min(8, max(1, (following or offset + 8) - offset))
            column = "comm_id" if name == COMM_ID else next((c for c, n in FIELDS.items() if n == name), None)
            if column is not None and width in (1, 2, 4, 8):
                fields[column] = (offset, width)
            at = offset + width
        if "comm_id" in fields:
            layouts[sid] = {"size": size, "names": {n for _, _, n, _ in rows}, "fields": fields}
    return layouts


def _events_with_payload(src: ExportSource) -> pa.Table:
    """The NVTX events that hold a payload: times, thread, name, schema hint and the payload's bytes (or text)."""
    cols = [c for c in ["start", "end", "globalTid", "textId", "text", "uint64Value", "binaryData"]
            if c in src.columns("NVTX_EVENTS")]
    if src.kind == "sqlite":
        select = ", ".join(f'"{c}"' if c != "binaryData" else
                           "CASE typeof(binaryData) WHEN 'blob' THEN binaryData ELSE CAST(binaryData AS BLOB) END "
                           "AS binaryData" for c in cols)
        return src._db.query(f"SELECT {select} FROM NVTX_EVENTS WHERE binaryData IS NOT NULL")
    if src.kind == "parquetdir":
        table = pq.read_table(src.path / "NVTX_EVENTS.parquet", columns=cols)
    else:
        table = src._arrow_file("NVTX_EVENTS").select(cols)
    return table.filter(table.column("binaryData").is_valid())


def _bytes_of(col: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(every payload's bytes one after another, where each starts, its length); text of hexadecimal digits (with or
    without a leading 0x) is turned into the bytes it spells."""
    if pa.types.is_large_binary(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.large_binary())
        offset_type = np.int64
    else:
        col = col.cast(pa.binary())
        offset_type = np.int32
    _, offsets_buf, data_buf = col.buffers()
    offsets = np.frombuffer(offsets_buf, offset_type)[col.offset:col.offset + len(col) + 1].astype(np.int64)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    if len(data) and _all_hex(data, starts, lengths):
        return _from_hex(data, starts, lengths)
    return data, starts, lengths


_HEX = np.full(256, -1, np.int16)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i


def _all_hex(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether every payload is text of hexadecimal digits: binary payloads almost never are, being full of zeros."""
    used = np.zeros(len(data), bool)
    span = np.repeat(starts, lengths) + (np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths))
    used[span] = True
    skip = _prefix_lengths(data, starts, lengths)
    used[np.repeat(starts, skip) + (np.arange(skip.sum()) - np.repeat(np.cumsum(skip) - skip, skip))] = False
    return bool(((lengths - skip) % 2 == 0).all() and (_HEX[data[used]] >= 0).all())


def _prefix_lengths(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    has = (lengths >= 2) & (data[np.minimum(starts, len(data) - 1)] == ord("0")) & \
        (np.isin(data[np.minimum(starts + 1, len(data) - 1)], [ord("x"), ord("X")]))
    return np.where(has, 2, 0).astype(np.int64)


def _from_hex(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
    skip = _prefix_lengths(data, starts, lengths)
    digits = (lengths - skip) // 2
    first = starts + skip
    pair = np.repeat(first, digits) + 2 * (np.arange(digits.sum()) - np.repeat(np.cumsum(digits) - digits, digits))
    out = (_HEX[data[pair]] * 16 + _HEX[data[pair + 1]]).astype(np.uint8)
    return out, np.cumsum(digits) - digits, digits


def _integers(data: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The little-endian signed integers of `width` bytes at these places."""
    if not len(at):
        return np.zeros(0, np.int64)
    raw = np.ascontiguousarray(data[at[:, None] + np.arange(width)])
    kind = {1: "<i1", 2: "<i2", 4: "<i4", 8: "<i8"}[width]
    return raw.view(kind).reshape(-1).astype(np.int64)


def _schema_of(raw: pa.Table, names, lengths: np.ndarray, layouts: dict) -> np.ndarray:
    """Each event's schema id, -1 where no schema decodes it."""
    n = raw.num_rows
    schema = np.full(n, -1, np.int64)
    if "uint64Value" in raw.column_names:
        hint = numpy_of(raw.column("uint64Value"), -1).astype(np.int64)
        known = np.isin(hint, np.array(list(layouts), np.int64))
        schema[known] = hint[known]
    words, at = names
    kind_of_word = np.array([_call_kind(str(w)) for w in words], object)
    for kind, entry in WANTED.items():
        candidates = [sid for sid, lay in layouts.items() if entry in lay["names"]]
        if kind == "plain":  # the fewest entries: a plain call carries no peer, root or operation
            candidates = sorted(candidates, key=lambda s: len(layouts[s]["names"]))[:1]
        for sid in candidates:
            size = layouts[sid]["size"]
            pick = (schema < 0) & (kind_of_word[at] == kind) & ((lengths >= size) if size else True)
            schema[pick] = sid
    return schema


# the entry that tells a call's schema among NCCL's
WANTED = {"init": "No. of ranks", "p2p": "Peer rank", "reduce": "Reduction operation", "rooted": "Root",
          "plain": "Message size [bytes]"}


def _call_kind(name: str) -> str:
    lower = name.lower()
    if "comminit" in lower or "commsplit" in lower:
        return "init"
    if lower in ("ncclsend", "ncclrecv"):
        return "p2p"
    if lower in ("ncclallreduce", "ncclreducescatter"):
        return "reduce"
    if lower in ("ncclbroadcast", "ncclbcast", "ncclreduce"):
        return "rooted"
    return "plain"
