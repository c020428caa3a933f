"""Reading one export's event tables (NVTX, GPU ops, CUDA runtime, MPI) into normalised `Frame`s."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import BadInputError
from .frames import Frame, arrow_of, numpy_of, one_array, strings_of
from .readers import MEMORY_EVENTS, MPI_PREFIX, TABLES, ExportSource, StringTable, pid_of, small_table, valid_of


def recorded_env(src: ExportSource) -> tuple[dict, str | None]:
    """The profiled process's environment as the report recorded it, and the host name nsys recorded for
    the machine (a HOSTNAME variable may have been handed down by a launcher from another node)."""
    env = small_table(src, "TARGET_INFO_SYSTEM_ENV", ["name", "value"])
    rows = dict(zip(env.get("name", []), env.get("value", []), strict=False))
    hostname = str(rows["Hostname"]).strip() if rows.get("Hostname") else None
    out = {}
    for item in str(rows.get("DeviceEnvironment") or "").split(";"):
        key, sep, value = item.partition("=")
        if sep:
            out[key.strip()] = value
    return out, hostname or None


def program_names(src: ExportSource) -> dict[str, str]:
    """Each process's name as the report recorded it (PROCESSES, by OS pid as text), where the export holds it: what
    tells reports of different programs apart."""
    rows = small_table(src, "PROCESSES", ["pid", "name"]) if src.has("PROCESSES") else {}
    return {str(p): str(n) for p, n in zip(rows.get("pid", []), rows.get("name", []), strict=False)
            if p is not None and n}


def session_start(src: ExportSource) -> int:
    starts = small_table(src, "TARGET_INFO_SESSION_START_TIME", ["utcEpochNs"]).get("utcEpochNs", [])
    return next((int(v) for v in starts if v is not None), 0)


NVTX_DTYPES = {"start_ns": "int64", "end_ns": "Int64", "event_type": "int64", "name": "object", "domain": "object",
               "tid": "int64", "pid": "int64"}
MPI_DTYPES = {"start_ns": "int64", "end_ns": "int64", "tid": "int64", "pid": "int64"}


def _ints(raw: pa.Table, column: str, fill: int = 0) -> np.ndarray:
    """An integer column as int64, nulls (and a missing column) as `fill`."""
    if column not in raw.column_names:
        return np.full(raw.num_rows, fill, np.int64)
    return numpy_of(raw.column(column), fill).astype(np.int64, copy=False)


def _tids(raw: pa.Table) -> np.ndarray:
    """globalTid with nulls as 0."""
    return _ints(raw, "globalTid")


def _nullable(raw: pa.Table, column: str) -> pa.Array:
    """An integer column as int64 with its nulls (all null when missing): an `Int64` column of a Frame."""
    if column not in raw.column_names:
        return pa.nulls(raw.num_rows, pa.int64())
    return one_array(raw.column(column))


def _read_events(src: ExportSource, table: str, cols: list[str], times: tuple[str, ...],
                 where: list | None = None) -> pa.Table:
    """A table's columns, without the rows lacking one of the `times` columns (never so in an export nsys
    wrote); a table with rows but without those columns is damaged."""
    raw = src.read_arrow(table, cols, where)
    if src.has(table) and not set(times) <= set(raw.column_names) and src.count(table):
        raise BadInputError(f"{src.origin}: table {table} has no {'/'.join(times)} columns, so the export is "
                            "damaged; export the report again with `nsys export`")
    return timed_rows(raw, cols, times)


def timed_rows(raw: pa.Table, cols: list[str], times: tuple[str, ...]) -> pa.Table:
    """The rows that have every one of the `times` columns; no rows: every column, empty."""
    if not raw.num_rows:  # a column read keeps its type (text may be a dictionary), one the reader typed null not
        return pa.table({c: raw.column(c) if c in raw.column_names and not pa.types.is_null(raw.column(c).type)
                         else pa.nulls(0, pa.string() if c == "text" else pa.int64()) for c in cols})
    missing = np.zeros(raw.num_rows, bool)
    for c in times:
        if raw.column(c).null_count:
            missing |= ~valid_of(one_array(raw.column(c)))
    return raw.filter(arrow_of(~missing)) if missing.any() else raw


def read_nvtx(src: ExportSource, strings: StringTable, only_rank_names: bool = False) -> Frame:
    """NVTX events with their names and domains (a range's name: its text when it has one, else the string its
    textId names). only_rank_names: just the events whose name may give a rank ("rank 3", "MPI Rank 3")."""
    where = [("textId", strings.ids_containing("rank")), ("text", "rank")] if only_rank_names else None
    return nvtx_frame(_read_events(src, "NVTX_EVENTS", TABLES["nvtx"]["NVTX_EVENTS"], NVTX_TIMES, where), strings)


NVTX_TIMES = ("start", "eventType")
DOMAIN_CREATE = 75  # the NVTX event that names a domain


def event_names(raw: pa.Table, strings: StringTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(words, at, unnamed): each NVTX event's name, words[at], its text when it has one, else the string its textId
    names; the words that were neither ("" now)."""
    n = raw.num_rows
    if "text" in raw.column_names:
        text_words, has_text, text_at = _text_codes(one_array(raw.column("text")))
    else:
        text_words, has_text, text_at = np.zeros(0, object), np.zeros(n, bool), np.zeros(n, np.int64)
    if "textId" in raw.column_names:
        id_words, id_at = strings.distinct(raw.column("textId"))
    else:
        id_words, id_at = np.array([None], object), np.zeros(n, np.int64)
    words = np.concatenate([text_words, id_words])
    unnamed = np.equal(words, None)
    words[unnamed] = ""
    return words, np.where(has_text, text_at, len(text_words) + id_at), unnamed


def nvtx_frame(raw: pa.Table, strings: StringTable) -> Frame:
    """NVTX_EVENTS rows as the normalised frame (domain-create events, which name domains, left out)."""
    n = raw.num_rows
    words, at, unnamed = event_names(raw, strings)
    event_type = _ints(raw, "eventType")
    domain_id = _ints(raw, "domainId")
    # a range's domain: the name of the first domain-create event (type 75) with its domainId
    create = np.flatnonzero(event_type == DOMAIN_CREATE)
    domain_at = np.full(n, len(words))
    if len(create):
        ids, first = np.unique(domain_id[create], return_index=True)
        pos = np.minimum(np.searchsorted(ids, domain_id), len(ids) - 1)
        known = ids[pos] == domain_id
        domain_at[known] = at[create[first[pos[known]]]]
    keep = slice(None) if not len(create) else event_type != DOMAIN_CREATE  # usually no create event: no copies
    tid = _tids(raw)
    end = _nullable(raw, "end") if not len(create) else _nullable(raw, "end").filter(arrow_of(keep))
    arrays = {"start_ns": arrow_of(_ints(raw, "start")[keep]), "end_ns": end,
              "event_type": arrow_of(event_type[keep]), "name": _dictionary_of(words, at[keep]),
              "domain": _dictionary_of(np.r_[words, [""]].astype(object), domain_at[keep]),
              "tid": arrow_of(tid[keep]), "pid": arrow_of(pid_of(tid[keep]))}
    # the domain column is `str` when some event (a create event included) has a named domain, as pandas infers it
    named_domain = bool(len(create)) and not np.r_[unnamed, True][domain_at].all()
    return Frame(pa.table(arrays), {**NVTX_DTYPES, "domain": "str" if named_domain else "object"})


def _text_codes(text: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the distinct words in order of first use, whether each row has one, its word's place): text as strings, or
    as a Parquet read's dictionary (readers.DICTIONARY_TEXT), which also holds the words of rows read before or after
    the batch, left out here as a dictionary_encode of the strings leaves them."""
    if not pa.types.is_dictionary(text.type):
        text = text.dictionary_encode()
        return (np.array(text.dictionary.to_pylist(), object), ~numpy_of(text.is_null(), False),
                numpy_of(text.indices, 0).astype(np.int64))
    at = numpy_of(text.indices, -1).astype(np.int64)
    used = numpy_of(pc.unique(text.indices).drop_null()).astype(np.int64)  # in order of first use
    place = np.full(len(text.dictionary) + 1, -1, np.int64)  # the last: a row without text
    place[used] = np.arange(len(used))
    return np.array(text.dictionary.take(arrow_of(used)).to_pylist(), object), at >= 0, place[at]


GPU_COLUMNS = [("deviceId", "device"), ("streamId", "stream"), ("correlationId", "correlation_id"),
               ("bytes", "bytes"), ("copyKind", "copy_kind"), ("srcKind", "src_kind"), ("dstKind", "dst_kind"),
               ("syncType", "sync_type"), ("srcDeviceId", "src_device"),
               ("dstDeviceId", "dst_device"), ("memKind", "mem_kind")]


def read_gpu(src: ExportSource, table: str, cols: list[str], strings: StringTable,
              where: list | None = None) -> Frame:
    """One GPU activity table, every column the recipes use present (null where the export lacks it)."""
    return gpu_frame(_read_events(src, table, cols, ("start", "end"), where), cols, strings)


def gpu_frame(raw: pa.Table, cols: list[str], strings: StringTable) -> Frame:
    """A GPU activity table's rows as the normalised frame, with the columns `cols` (export names) asks for."""
    n = raw.num_rows
    have = set(raw.column_names)
    arrays = {"start_ns": arrow_of(_ints(raw, "start")), "end_ns": arrow_of(_ints(raw, "end"))}
    dtypes = {"start_ns": "int64", "end_ns": "int64"}
    for src_col, dst in GPU_COLUMNS:
        if src_col in cols:
            arrays[dst] = one_array(raw.column(src_col)) if src_col in have else pa.nulls(n, pa.int64())
            dtypes[dst] = "Int64"
    arrays["pid"], dtypes["pid"] = arrow_of(pid_of(_ints(raw, "globalPid"))), "int64"
    if "shortName" in cols:
        # a kernel's name: its short name (the full name when the export has no short names); its full name:
        # the demangled name, else the short name
        short = "shortName" if "shortName" in have else "demangledName" if "demangledName" in have else None
        full = "demangledName" if "demangledName" in have else short
        if short is None:
            name_words, name_at = np.array([""], object), np.zeros(n, np.int64)
            full_words, full_at = name_words, name_at
        else:
            name_words, name_at = strings.distinct(raw.column(short))
            name_words = np.array(["" if w is None else w for w in name_words], dtype=object)
            full_words, full_at = strings.distinct(raw.column(full))
            lacking = np.equal(full_words, None)
            if lacking.any():  # a full name missing: the short name stands for it
                short_for = lacking[full_at]
                full_at = np.where(short_for, len(full_words) + name_at, full_at)
                full_words = np.concatenate([full_words, name_words])
        arrays["name"], dtypes["name"] = _dictionary_of(name_words, name_at), "object"
        arrays["full_name"], dtypes["full_name"] = _dictionary_of(full_words, full_at), "object"
    return Frame(pa.table(arrays), dtypes)


def _dictionary_of(words: np.ndarray, at: np.ndarray) -> pa.DictionaryArray:
    """words[at] as a dictionary column with each distinct string once."""
    enc = strings_of(words).dictionary_encode()
    codes = numpy_of(enc.indices).astype(np.int32)[at] if len(at) else np.zeros(0, np.int32)
    return pa.DictionaryArray.from_arrays(arrow_of(codes), enc.dictionary)


def read_runtime(src: ExportSource, strings: StringTable, where: list | None = None) -> Frame:
    return runtime_frame(_read_events(src, "CUPTI_ACTIVITY_KIND_RUNTIME",
                                      TABLES["runtime"]["CUPTI_ACTIVITY_KIND_RUNTIME"], ("start", "end"), where),
                         strings)


def runtime_frame(raw: pa.Table, strings: StringTable) -> Frame:
    tid = _tids(raw)
    corr = _nullable(raw, "correlationId")
    arrays = {"start_ns": arrow_of(_ints(raw, "start")), "end_ns": arrow_of(_ints(raw, "end")),
              "tid": arrow_of(tid), "pid": arrow_of(pid_of(tid)), "correlation_id": corr,
              "name": _dictionary_of(*_id_words(raw, "nameId", strings, ""))}
    # a call without a correlation id makes the column nullable
    return Frame(pa.table(arrays), {"start_ns": "int64", "end_ns": "int64", "tid": "int64", "pid": "int64",
                                    "correlation_id": "Int64" if corr.null_count else "int64", "name": "str"})


def _id_words(raw: pa.Table, column: str, strings: StringTable, missing: str) -> tuple[np.ndarray, np.ndarray]:
    """(words, at): words[at] the strings a column of string ids names, `missing` for a null or unknown id or
    a missing column."""
    if column not in raw.column_names:
        return np.array([missing], object), np.zeros(raw.num_rows, np.int64)
    words, at = strings.distinct(raw.column(column))
    words[np.equal(words, None)] = missing
    return words, at


def _mpi_tables(src: ExportSource) -> list[str]:
    return sorted(t for t in src.tables if t.startswith(MPI_PREFIX) and t.endswith("_EVENTS"))


def read_mpi(src: ExportSource, strings: StringTable) -> Frame:
    """Every MPI_*_EVENTS table's calls, tables in name order; a call's name is its textId's string, "MPI"
    without one."""
    raws = [raw for raw in (_read_events(src, t, ["start", "end", "globalTid", "textId"], ("start", "end"))
                            for t in _mpi_tables(src)) if raw.num_rows]
    tid = np.concatenate([_tids(raw) for raw in raws]) if raws else np.zeros(0, np.int64)
    names = [_id_words(raw, "textId", strings, "MPI") for raw in raws]
    words = np.concatenate([w for w, _ in names]) if names else np.zeros(0, object)
    base = np.cumsum([0] + [len(w) for w, _ in names[:-1]])
    at = np.concatenate([a + b for (_, a), b in zip(names, base, strict=True)]) if names else np.zeros(0, np.int64)
    arrays = {"start_ns": arrow_of(np.concatenate([_ints(raw, "start") for raw in raws]) if raws else tid),
              "end_ns": arrow_of(np.concatenate([_ints(raw, "end") for raw in raws]) if raws else tid),
              "tid": arrow_of(tid), "pid": arrow_of(pid_of(tid)), "name": _dictionary_of(words, at)}
    # names are `str` when every table lacks textId (all "MPI"), else `object`, as pandas infers them
    named = not raws or any("textId" in raw.column_names for raw in raws)
    return Frame(pa.table(arrays), {**MPI_DTYPES, "name": "object" if named else "str"})


# ENUM_CUDA_MEM_KIND as Nsight Systems writes it, for an export that lacks the table
MEMORY_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
                6: "Managed Static", 7: "Unknown"}
MEMORY_COLUMNS = [("deviceId", "device", -1), ("correlationId", "correlation_id", 0), ("address", "address", 0),
                  ("bytes", "bytes", 0), ("memKind", "mem_kind", 7), ("memoryOperationType", "op", -1),
                  ("localMemoryPoolAddress", "pool", 0), ("localMemoryPoolSize", "pool_size", 0)]


def read_memory(src: ExportSource) -> Frame:
    """Every CUDA allocation and free (`nsys profile --cuda-memory-usage=true`): op 0 allocates, 1 frees; the memory
    kind by its number and its name (the export's ENUM_CUDA_MEM_KIND); a pool's address and size where the memory
    came from a stream-ordered pool (0 where not)."""
    (table, cols), = [(t, c) for t, c in TABLES["memory"].items() if t == MEMORY_EVENTS]
    raw = _read_events(src, table, cols, ("start",))
    arrays = {"start_ns": arrow_of(_ints(raw, "start")), "pid": arrow_of(pid_of(_ints(raw, "globalPid")))}
    for column, name, fill in MEMORY_COLUMNS:
        arrays[name] = arrow_of(_ints(raw, column, fill))
    kinds = small_table(src, "ENUM_CUDA_MEM_KIND", ["id", "label"]) if src.has("ENUM_CUDA_MEM_KIND") else {}
    named = {**MEMORY_KINDS, **{int(i): str(w) for i, w in zip(kinds.get("id", []), kinds.get("label", []),
                                                               strict=False) if i is not None and w}}
    codes, at = np.unique(numpy_of(arrays["mem_kind"]), return_inverse=True)
    words = np.array([named.get(int(c), f"kind {int(c)}") for c in codes] or [""], object)
    arrays["kind"] = _dictionary_of(words, at.reshape(-1))
    return Frame(pa.table(arrays), {**dict.fromkeys(arrays, "int64"), "kind": "str"})


def read_gpus(src: ExportSource) -> Frame:
    """The GPUs of the report: device id, name and total memory in bytes (0 where not recorded)."""
    gpus = small_table(src, "TARGET_INFO_GPU", ["id", "name", "totalMemory"]) if src.has("TARGET_INFO_GPU") else {}
    ids = [int(i) if i is not None else -1 for i in gpus.get("id", [])]
    rows = {"device": arrow_of(np.array(ids, np.int64)),
            "gpu_name": strings_of(np.array([str(n or "") for n in gpus.get("name", [""] * len(ids))], object)),
            "total_bytes": arrow_of(np.array([int(b or 0) for b in gpus.get("totalMemory", [0] * len(ids))],
                                             np.int64))}
    return Frame(pa.table(rows), {"device": "int64", "gpu_name": "str", "total_bytes": "int64"})
