"""Record the table and column names and types of a real Nsight Systems export.

The synthetic export writer (`nsys_recipe_pack.synth`) reads the resulting JSON so that what it writes
has the same shape as a real export of that nsys version. Usage:

    nsys export --type sqlite -o R.sqlite R.nsys-rep
    nsys export --type parquetdir -o R_pqtdir R.nsys-rep
    python scripts/dump_export_schema.py R.sqlite R_pqtdir 2023.4.4.54 > src/nsys_recipe_pack/data/nsys_2023_4_schema.json
"""

import json
import sqlite3
import sys
from pathlib import Path

import pyarrow.parquet as pq

TABLES = ["StringIds", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
          "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
          "TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_SYSTEM_ENV", "PROCESSES", "ThreadNames",
          "META_DATA_EXPORT"]


def main(sqlite_path: str, pqtdir: str, version: str) -> None:
    con = sqlite3.connect(sqlite_path)
    out = {"nsys_version": version, "tables": {}}
    for table in TABLES:
        cols = [(r[1], r[2]) for r in con.execute(f'PRAGMA table_info("{table}")')]
        pfile = Path(pqtdir) / f"{table}.parquet"
        arrow = {}
        if pfile.exists():
            schema = pq.read_schema(pfile)
            arrow = {f.name: [str(f.type), f.nullable] for f in schema}
        out["tables"][table] = [
            {"name": name, "sqlite": typ, "arrow": arrow.get(name, [None, True])[0],
             "nullable": arrow.get(name, [None, True])[1]}
            for name, typ in cols
        ]
    meta = dict(con.execute("SELECT name, value FROM META_DATA_EXPORT"))
    out["schema_version"] = meta.get("EXPORT_SCHEMA_VERSION")
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
