"""Record the table and column names, order and types of a real Nsight Systems export as JSON.

Only names and types are recorded (plus the names of the META_DATA_EXPORT rows), never event data. The
synthetic export writer (`nsys_recipe_pack.synth`) writes what this describes, and tests/test_synth.py
checks its output against the recorded facts. Usage:

    nsys export --type sqlite -o R.sqlite R.nsys-rep
    nsys export --type parquetdir -o R_pqtdir R.nsys-rep
    python scripts/dump_export_schema.py R.sqlite R_pqtdir > tests/data/nsys_2023_4_schema.json

Per column: `sqlite` (declared type), `notnull` and `pk` (from `PRAGMA table_info`), `arrow` and
`nullable` (the Parquet file's Arrow schema; null when the parquetdir export has no such table).
`--tables` limits or extends the list (default: the tables the synthetic writer produces).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

import pyarrow.parquet as pq

TABLES = ["StringIds", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
          "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
          "TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_SYSTEM_ENV", "PROCESSES", "ThreadNames",
          "META_DATA_EXPORT", "TARGET_INFO_GPU", "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND",
          "ENUM_CUPTI_SYNC_TYPE"]


def dump(sqlite_path: Path, pqtdir: Path, tables: list[str], version: str | None = None) -> dict:
    con = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    try:
        meta = con.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall()
        present = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        missing = [t for t in tables if t not in present]
        if missing:
            raise SystemExit(f"{sqlite_path}: no table {', '.join(missing)}")
        out = {"nsys_version": version or dict(meta).get("EXPORT_PRODUCT_VERSION"),
               "schema_version": dict(meta).get("EXPORT_SCHEMA_VERSION"),
               "meta_data_export_names": [name for name, _ in meta],
               "tables": {}}
        for table in tables:
            pfile = pqtdir / f"{table}.parquet"
            arrow = {f.name: (str(f.type), f.nullable) for f in pq.read_schema(pfile)} if pfile.exists() else {}
            out["tables"][table] = [
                {"name": name, "sqlite": typ, "notnull": bool(notnull), "pk": bool(pk),
                 "arrow": arrow.get(name, (None, True))[0], "nullable": arrow.get(name, (None, True))[1]}
                for _, name, typ, notnull, _, pk in con.execute(f'PRAGMA table_info("{table}")')
            ]
        return out
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sqlite", type=Path, help="an `nsys export --type sqlite` file")
    parser.add_argument("pqtdir", type=Path, help="the same report's `nsys export --type parquetdir` folder")
    parser.add_argument("version", nargs="?", help="Nsight Systems version (default: from META_DATA_EXPORT)")
    parser.add_argument("--tables", nargs="+", default=TABLES)
    args = parser.parse_args(argv)
    sys.stdout.write(to_json(dump(args.sqlite, args.pqtdir, args.tables, args.version)))
    return 0


def to_json(schema: dict) -> str:
    """Indented JSON with one column per line, so the file stays short and diffs stay readable."""
    head = {k: v for k, v in schema.items() if k != "tables"}
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()] + [' "tables": {']
    for i, (table, cols) in enumerate(schema["tables"].items()):
        lines.append(f"  {json.dumps(table)}: [")
        lines += [f"   {json.dumps(c)}" + ("," if j < len(cols) - 1 else "") for j, c in enumerate(cols)]
        lines.append("  ]" + ("," if i < len(schema["tables"]) - 1 else ""))
    return "\n".join([*lines, " }", "}", ""])


if __name__ == "__main__":
    sys.exit(main())
