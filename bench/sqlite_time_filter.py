"""How much of a long capture's SQLite export a filter on time, run inside SQLite, would spare sync_summary.

SQLite has no index on times, so any filter on them visits every row; what it can spare is the driver's conversion
of the rows it rejects. The cheapest test found is one byte of a blob bound to the query, a byte per time bucket
(the shortest power of two of nanoseconds, from 2^17, whose blob holds the capture in BLOB_MAX_BYTES), 1 for the
buckets near a blocking call: a range or op no longer than a bucket can touch a call only if it starts in the
bucket of the call or in one up to a bucket before it; longer ones are kept whatever their bucket. This reads the
runtime calls picked by name, and the NVTX ranges and kernels the test keeps, through ADBC as the pack does, on one
connection and on two (each half of the rowids), and prints the rows kept and the time taken.

The blocking calls come from the pack's own output for that report (its `sync_calls.parquet`), e.g. from the
Parquet form of bench/huge.py's 2,000-copy case:

    .venv/bin/nsys-recipe run --name sync_summary --output /tmp/sync54 WORK/a100x2000/a100x2000_pqtdir
    .venv/bin/python bench/sqlite_time_filter.py WORK/a100x2000/a100x2000.sqlite /tmp/sync54/sync_calls.parquet
"""

from __future__ import annotations

import argparse
import sqlite3
import threading
import time

import adbc_driver_sqlite.dbapi as adbc
import numpy as np
import pyarrow.parquet as pq

BLOB_MAX_BYTES = 32 << 20
COLUMNS = {"NVTX_EVENTS": "start, end, globalTid, eventType, textId, text, domainId",
           "CUPTI_ACTIVITY_KIND_KERNEL": "start, end, globalPid"}


def near_calls(start: np.ndarray, end: np.ndarray, bucket_ns: int) -> bytes:
    """A byte per bucket from time 0: 1 where a call lies in it or in the bucket after it."""
    first, last = np.maximum((start - bucket_ns) // bucket_ns, 0), end // bucket_ns
    edges = np.zeros(int(last.max()) + 2, np.int64)
    np.add.at(edges, first, 1)
    np.add.at(edges, last + 1, -1)
    return (np.cumsum(edges)[:-1] > 0).astype(np.uint8).tobytes()


def kept_query(table: str, bucket_ns: int) -> str:
    """The rows of a table the blob (the query's parameter) keeps, of the rowids {first} to {last}."""
    return (f"SELECT {COLUMNS[table]} FROM {table} WHERE rowid BETWEEN {{first}} AND {{last}} AND "
            f"(end IS NULL OR end - start > {bucket_ns} OR substr(?, start / {bucket_ns} + 1, 1) = X'01')")


# the runtime calls sync_summary reads first, picked by name in SQL (about those `_may_block` in
# src/nsys_recipe_pack/recipes/sync_summary.py picks)
MAY_BLOCK = ("value GLOB '*Synchronize*' OR value GLOB '*StreamWaitEvent*' OR value GLOB 'cudaMemcpy*' OR "
             "(value GLOB 'cudaMemset*' AND lower(value) NOT LIKE '%async%')")
CALLS_QUERY = ("SELECT start, end, globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE rowid "
               f"BETWEEN {{first}} AND {{last}} AND nameId IN (SELECT id FROM StringIds WHERE {MAY_BLOCK})")


def count_read(path: str, query: str, parameters: tuple, out: list) -> None:
    """The rows a query gives, read through ADBC as the pack reads SQLite."""
    with adbc.connect(f"file:{path}?mode=ro") as conn, conn.cursor() as cur:
        cur.execute(query, parameters=parameters or None)
        out.append(sum(batch.num_rows for batch in cur.fetch_record_batch()))


def timed(what: str, path: str, rows: int, query: str, parameters: tuple = ()) -> None:
    """A query over rowids 1 to `rows` on one connection, then on two (each half of the rowids)."""
    for connections in (1, 2):
        step = rows // connections + 1
        out: list = []
        started = time.perf_counter()
        threads = [threading.Thread(target=count_read, args=(path, query.format(first=i * step + 1,
                                                                                last=(i + 1) * step),
                                                             parameters, out))
                   for i in range(connections)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(f"{what}: {sum(out)} of {rows} rows kept ({sum(out) / rows:.1%}), read in "
              f"{time.perf_counter() - started:.2f} s on {connections} connection(s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sqlite")
    ap.add_argument("calls", help="sync_calls.parquet of the pack's sync_summary on the same report")
    args = ap.parse_args()
    calls = pq.read_table(args.calls, columns=["start_ns", "end_ns"])
    start, end = (calls.column(c).to_numpy() for c in ("start_ns", "end_ns"))
    bucket_ns = 1 << 17
    while int(end.max()) // bucket_ns > BLOB_MAX_BYTES:
        bucket_ns <<= 1
    blob = near_calls(start, end, bucket_ns)
    print(f"{len(start)} calls; buckets of {bucket_ns} ns, a {len(blob) / 2**20:.0f} MB blob, "
          f"{blob.count(1) / len(blob):.1%} of them marked")
    with sqlite3.connect(f"file:{args.sqlite}?mode=ro", uri=True) as db:
        rows = {t: db.execute(f"SELECT max(rowid) FROM {t}").fetchone()[0]
                for t in [*COLUMNS, "CUPTI_ACTIVITY_KIND_RUNTIME"]}
    timed("CUPTI_ACTIVITY_KIND_RUNTIME by name", args.sqlite, rows.pop("CUPTI_ACTIVITY_KIND_RUNTIME"), CALLS_QUERY)
    for table, n in rows.items():
        timed(table, args.sqlite, n, kept_query(table, bucket_ns), (blob,))


if __name__ == "__main__":
    main()
