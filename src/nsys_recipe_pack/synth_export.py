"""How a SYNTHETIC export is laid out and written: the tables and columns of a real Nsight Systems export (2023.4's,
`data/nsys_2023_4_schema.json`, or a newer shape), Arrow tables typed as the export types them, and one rank's export
written as SQLite or as a Parquet folder, a block of tables at a time. `synth.py` and `synth_megatron.py` write
their jobs through it.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import UsageError
from .lazy import pd

SCHEMA_FILE = Path(__file__).with_name("data") / "nsys_2023_4_schema.json"
SYNTHETIC_LABEL = "nsys-recipe-pack synthetic export"
PARQUET_ROW_GROUP = 2048  # as Nsight Systems' parquetdir export: several row groups per larger table


def spec(text: str) -> list[dict]:
    """Compact column list `name:arrowtype[!]` (`!` = NOT NULL) -> schema entries; SQLite types follow arrow's."""
    cols = []
    for item in text.split():
        name, arrow = item.split(":")
        required = arrow.endswith("!")
        arrow = arrow.rstrip("!")
        sql = "TEXT" if arrow == "string" else "REAL" if arrow in ("float", "double") else \
            "BLOB" if arrow == "binary" else "INTEGER"
        cols.append({"name": name, "sqlite": sql, "arrow": arrow, "nullable": not required})
    return cols


_ENUM = spec("id:int64! name:string label:string")
# Tables written beyond data/nsys_2023_4_schema.json, as the same real 2023.4 export has them.
EXTRA_TABLES = {
    "TARGET_INFO_GPU": spec(
        "vmId:int64! id:int64! name:string busLocation:string isDiscrete:bool l2CacheSize:int64 totalMemory:uint64 "
        "memoryBandwidth:uint64 clockRate:int64 smCount:int64 pwGpuId:int64 uuid:string luid:uint64 chipName:string "
        "cuDevice:int32 ctxswDevPath:string ctrlDevPath:string revision:int64 nodeMask:int64 constantMemory:int64 "
        "maxIPC:int64 maxRegistersPerBlock:int64 maxShmemPerBlock:int64 maxShmemPerBlockOptin:int64 "
        "maxShmemPerSm:int64 maxRegistersPerSm:int64 threadsPerWarp:int64 asyncEngines:int64 maxWarpsPerSm:int64 "
        "maxBlocksPerSm:int64 maxThreadsPerBlock:int64 maxBlockDimX:int64 maxBlockDimY:int64 maxBlockDimZ:int64 "
        "maxGridDimX:int64 maxGridDimY:int64 maxGridDimZ:int64 computeMajor:int64 computeMinor:int64 smMajor:int64 "
        "smMinor:int64"),
    "ENUM_CUDA_MEMCPY_OPER": _ENUM,
    "ENUM_CUDA_MEM_KIND": _ENUM,
    "ENUM_CUPTI_SYNC_TYPE": _ENUM,
    "MPI_OTHER_EVENTS": spec("start:int64! end:int64 globalTid:uint64 textId:int64"),
    # written only with a MemoryPlan: its columns as Nsight Systems documents the table
    "CUDA_GPU_MEMORY_USAGE_EVENTS": spec(
        "start:int64! globalPid:uint64 deviceId:int64! contextId:uint64! address:uint64! pc:uint64! bytes:uint64! "
        "memKind:int64! memoryOperationType:int64! name:string correlationId:int64 streamId:uint64 "
        "localMemoryPoolAddress:uint64 localMemoryPoolReleaseThreshold:uint64 localMemoryPoolSize:uint64 "
        "localMemoryPoolUtilizedSize:uint64 importedMemoryPoolAddress:uint64 importedMemoryPoolProcessId:uint64"),
    "ENUM_CUDA_DEV_MEM_EVENT_OPER": _ENUM,
}
# The enum values the exports use (CUPTI's enums as Nsight Systems numbers them).
ENUMS = {
    "ENUM_CUDA_MEMCPY_OPER": ("CUDA_MEMCPY_KIND_", [
        ("UNKNOWN", "Unknown"), ("HTOD", "Host-to-Device"), ("DTOH", "Device-to-Host"), ("HTOA", "Host-to-Array"),
        ("ATOH", "Array-to-Host"), ("ATOA", "Array-to-Array"), ("ATOD", "Array-to-Device"),
        ("DTOA", "Device-to-Array"), ("DTOD", "Device-to-Device"), ("HTOH", "Host-to-Host"),
        ("PTOP", "Peer-to-Peer"), ("UVM_HTOD", "Unified Host-to-Device"), ("UVM_DTOH", "Unified Device-to-Host"),
        ("UVM_DTOD", "Unified Device-to-Device")]),
    "ENUM_CUDA_MEM_KIND": ("CUDA_MEMOPR_MEMORY_KIND_", [
        ("PAGEABLE", "Pageable"), ("PINNED", "Pinned"), ("DEVICE", "Device"), ("ARRAY", "Array"),
        ("MANAGED", "Managed"), ("DEVICE_STATIC", "Device Static"), ("MANAGED_STATIC", "Managed Static"),
        ("UNKNOWN", "Unknown")]),
    "ENUM_CUPTI_SYNC_TYPE": ("CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_", [
        ("UNKNOWN", "Unknown"), ("EVENT_SYNCHRONIZE", "Event sync"), ("STREAM_WAIT_EVENT", "Stream wait sync"),
        ("STREAM_SYNCHRONIZE", "Stream sync"), ("CONTEXT_SYNCHRONIZE", "Context sync")]),
}
PRIMARY_KEYS = {"StringIds": "id", **{t: "id" for t in ENUMS}}

NEWER_SCHEMA_VERSION = "3.25.0"
# What newer exports (schema 3.16 to 3.25) add over 2023.4's, as seen in real ones: extra columns on existing
# tables and a new table. Readers must ignore what they do not know.
NEWER_COLUMNS = {
    "NVTX_EVENTS": [{"name": "eventId", "sqlite": "INTEGER", "arrow": "uint64", "nullable": True},
                    {"name": "binaryData", "sqlite": "BLOB", "arrow": "binary", "nullable": True}],
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": [{"name": "eventSyncId", "sqlite": "INTEGER", "arrow": "uint64",
                                             "nullable": True}],
}
NEWER_TABLES = {
    "TARGET_INFO_CUDA_DEVICE": [{"name": "cudaId", "sqlite": "INTEGER", "arrow": "int32", "nullable": False},
                                {"name": "pid", "sqlite": "INTEGER", "arrow": "int64", "nullable": True},
                                {"name": "uuid", "sqlite": "TEXT", "arrow": "string", "nullable": True},
                                {"name": "name", "sqlite": "TEXT", "arrow": "string", "nullable": True}],
}


def schema_of(shape: str = "2023.4") -> dict:
    schema = json.loads(SCHEMA_FILE.read_text())
    schema["tables"].update(EXTRA_TABLES)
    if shape == "newer":
        for table, cols in NEWER_COLUMNS.items():
            schema["tables"][table] = schema["tables"][table] + cols
        schema["tables"].update(NEWER_TABLES)
        schema["schema_version"] = NEWER_SCHEMA_VERSION
    elif shape != "2023.4":
        raise UsageError(f"--schema {shape}: use 2023.4 or newer")
    return schema


def typed(table: str, df: pd.DataFrame, schema: dict) -> pa.Table:
    """The frame as an Arrow table with the export's exact column order, types and nullability."""
    cols = schema["tables"][table]
    unknown = set(df.columns) - {c["name"] for c in cols}
    if unknown:
        raise ValueError(f"{table}: columns {sorted(unknown)} are not in the export schema")
    arrays, fields = [], []
    for c in cols:
        typ = pa.type_for_alias(c["arrow"])
        values = df[c["name"]] if c["name"] in df else pd.Series([None] * len(df), dtype=object, index=df.index)
        if pa.types.is_integer(typ) or pa.types.is_floating(typ):
            values = pd.to_numeric(values, errors="coerce")
            mask = values.isna().to_numpy()
            arr = pa.array(values.fillna(0).to_numpy().astype(typ.to_pandas_dtype()), type=typ,
                           mask=mask if mask.any() else None)
        else:
            arr = pa.array(values.astype(object).where(values.notna(), None).tolist(), type=typ)
        if arr.null_count and not c["nullable"]:
            raise ValueError(f"{table}.{c['name']}: nulls in a NOT NULL column")
        arrays.append(arr)
        fields.append(pa.field(c["name"], typ, nullable=c["nullable"]))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def ddl(table: str, schema: dict) -> str:
    pk = PRIMARY_KEYS.get(table)
    cols = []
    for c in schema["tables"][table]:
        decl = f'"{c["name"]}" {c["sqlite"]}'
        if not c["nullable"]:
            decl += " NOT NULL"
        if c["name"] == pk:
            decl += " PRIMARY KEY"
        cols.append(decl)
    return f'CREATE TABLE "{table}" ({", ".join(cols)})'


@contextlib.contextmanager
def export_writer(path: Path, fmt: str, schema: dict):
    """A function writing tables into one rank's export: a table met again is appended to (ADBC's bulk insert
    for SQLite, a row group after another for Parquet)."""
    made: dict = {}  # table -> its Parquet writer (None for SQLite)
    if fmt == "sqlite":
        import adbc_driver_sqlite.dbapi

        con = adbc_driver_sqlite.dbapi.connect(str(path))
        cursor = con.cursor()

        def write(tables: dict[str, pa.Table]) -> None:
            for table, data in tables.items():
                if table not in made:
                    cursor.execute(ddl(table, schema))
                    made[table] = None
                cursor.adbc_ingest(table, data, mode="append")
        try:
            yield write
            con.commit()
        finally:
            cursor.close()
            con.close()
        return
    path.mkdir()

    def write(tables: dict[str, pa.Table]) -> None:
        for table, data in tables.items():
            if table not in made:
                made[table] = pq.ParquetWriter(path / f"{table}.parquet", data.schema, version="1.0",
                                               compression="none")
            made[table].write_table(data, row_group_size=PARQUET_ROW_GROUP)
    try:
        yield write
    finally:
        for writer in made.values():
            writer.close()


def shared_tables(strings: dict, schema: dict) -> dict[str, pa.Table]:
    """The tables every rank's export holds unchanged."""
    version = schema["schema_version"]
    major, minor, micro = (version.split(".") + ["0", "0"])[:3]
    meta = pd.DataFrame([
        ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"), ("EXPORT_PRODUCT_VERSION", schema["nsys_version"]),
        ("EXPORT_PRODUCT_DATE", ".".join(schema["nsys_version"].split(".")[:2])),
        ("EXPORT_SCHEMA_VERSION", version), ("EXPORT_SCHEMA_VERSION_MAJOR", major),
        ("EXPORT_SCHEMA_VERSION_MINOR", minor), ("EXPORT_SCHEMA_VERSION_MICRO", micro),
        ("EXPORT_PLATFORM", "linux-desktop"), ("EXPORT_ARCH", "x64"),
        ("SYNTHETIC", SYNTHETIC_LABEL),
    ], columns=["name", "value"])
    out = {"StringIds": pd.DataFrame({"id": list(strings.values()), "value": list(strings.keys())}),
           "META_DATA_EXPORT": meta}
    for table, (prefix, rows) in ENUMS.items():
        out[table] = pd.DataFrame({"id": range(len(rows)), "name": [prefix + n for n, _ in rows],
                                   "label": [label for _, label in rows]})
    return {t: typed(t, df, schema) for t, df in out.items()}


def check_output(out: Path, overwrite: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise UsageError(f"{out}: already exists and is not empty; choose another --output or pass "
                         "--force-overwrite")
