"""Damaged or unusual variants of real SQLite exports, built with SQL, for the sweep of tests/test_sweep.py.

Each variant starts from copies of real exports (sample_reports/h100_gloo_8rank, tests/data/nccl_2gpu_h100) and
changes them the way reports from other jobs differ: several processes in one file, per-op NVTX names, names
stored another way or missing, tables missing or empty, odd timestamps, bytes that are not UTF-8. What comes out
is a real export altered by the test, not a new profile.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "sample_reports" / "h100_gloo_8rank"
NCCL = ROOT / "tests" / "data" / "nccl_2gpu_h100" / "mfu_2gpu_before.sqlite"

EVENT_TABLES = ["NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"]
STRING_OFFSET = 1_000_000  # string ids of a merged-in export move up by this
PID_SHIFT = 1 << 24  # globalTid/globalPid hold the pid from bit 24


def tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f"PRAGMA table_info({table})")]


def string_columns(con: sqlite3.Connection, table: str) -> list[str]:
    """Columns the export's own schema comments mark as ids into StringIds."""
    sql = con.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    return re.findall(r"^\s*(\w+)\s+INTEGER[^\n]*REFERENCES StringIds\(id\)", sql, flags=re.M)


def session_start(con: sqlite3.Connection) -> int:
    return int(con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0])


def copy(src: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return dest


def edit(path: Path, *statements: str) -> Path:
    con = sqlite3.connect(path)
    for s in statements:
        con.execute(s)
    con.commit()
    con.close()
    return path


def merge(into: Path, other: Path, device: int = 1) -> Path:
    """`other`'s events added to `into` as another process on GPU `device`, on `into`'s clock: one file holding two
    training processes, as `nsys profile torchrun ...` records them."""
    con = sqlite3.connect(into)
    con.execute("ATTACH DATABASE ? AS other", (str(other),))
    other_start = con.execute("SELECT utcEpochNs FROM other.TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    shift = int(other_start) - session_start(con)
    pid_delta = PID_SHIFT * 100_000  # pid + 100000: never one of `into`'s
    con.execute(f"INSERT INTO StringIds SELECT id + {STRING_OFFSET}, value FROM other.StringIds")
    for table in EVENT_TABLES:
        if table not in tables(con):
            continue
        cols = columns(con, table)
        strings = set(string_columns(con, table))
        picked = []
        for c in cols:
            if c in strings:
                picked.append(f"{c} + {STRING_OFFSET}")
            elif c in ("start", "end"):
                picked.append(f"{c} + {shift}")
            elif c in ("globalTid", "globalPid", "endGlobalTid"):
                picked.append(f"{c} + {pid_delta}")
            elif c == "deviceId":
                picked.append(str(device))
            else:
                picked.append(c)
        con.execute(f"INSERT INTO main.{table} ({', '.join(cols)}) SELECT {', '.join(picked)} FROM other.{table}")
    con.commit()
    con.execute("DETACH DATABASE other")
    con.close()
    return into


def nvtx_names(path: Path, how: str, keep: str | None = None) -> Path:
    """NVTX range names stored another way: `unique` (a sequence number in every name but `keep`, as PyTorch's
    emit_nvtx names its per-op ranges), `text` (only in the text column), `textId` (only through StringIds) or
    `null`."""
    name = "coalesce(text, (SELECT value FROM StringIds WHERE id = textId))"
    ranges = "eventType IN (59, 60)"
    if how == "unique":
        kept = f"AND {name} IS NOT '{keep}'" if keep else ""
        return edit(path, f"UPDATE NVTX_EVENTS SET text = {name} || ', op_id = ' || rowid, textId = NULL "
                          f"WHERE {ranges} {kept}")
    if how == "text":
        return edit(path, f"UPDATE NVTX_EVENTS SET text = {name}, textId = NULL WHERE {ranges}")
    if how == "textId":
        return edit(path,
                    "INSERT INTO StringIds SELECT 2000000 + rowid, text FROM NVTX_EVENTS "
                    f"WHERE {ranges} AND text IS NOT NULL",
                    f"UPDATE NVTX_EVENTS SET textId = 2000000 + rowid, text = NULL WHERE {ranges} AND text IS NOT NULL")
    if how == "null":
        return edit(path, f"UPDATE NVTX_EVENTS SET text = NULL, textId = NULL WHERE {ranges}")
    raise ValueError(how)


def first_iterations(path: Path, count: int, name: str = "step") -> Path:
    """Only the first `count` ranges named `name` and what happened before the last one's end: a shorter capture."""
    con = sqlite3.connect(path)
    ends = con.execute("SELECT n.end FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
                       "WHERE coalesce(n.text, s.value) = ? ORDER BY n.start", (name,)).fetchall()
    con.close()
    end = int(ends[count - 1][0])
    return edit(path, *[f"DELETE FROM {t} WHERE start > {end}" for t in EVENT_TABLES])


def odd_times(path: Path) -> Path:
    """Zero-length and reversed events (end before start) in every event table with an end."""
    return edit(path, *[s for t in EVENT_TABLES for s in (
        f"UPDATE {t} SET end = start WHERE rowid % 7 = 0",
        f"UPDATE {t} SET end = start - 1000 WHERE rowid % 11 = 0")])


def bad_utf8(path: Path) -> Path:
    """Names holding bytes that are not UTF-8 (kernels, runtime calls and NVTX ranges through StringIds, NVTX text)."""
    return edit(path,
                "UPDATE StringIds SET value = CAST(X'ff6e616d65c3' || CAST(value AS BLOB) AS TEXT) WHERE id % 3 = 0",
                "UPDATE NVTX_EVENTS SET text = CAST(CAST(text AS BLOB) || X'fe80' AS TEXT) WHERE text IS NOT NULL")


def build(root: Path) -> dict[str, list[Path]]:
    """Every case: a name and the export files that make up its run."""
    h = [H100 / f"rank{r}.sqlite" for r in range(3)]
    cases: dict[str, list[Path]] = {}

    def two(name: str) -> list[Path]:
        return [copy(h[0], root / name / "rank0.sqlite"), copy(h[1], root / name / "rank1.sqlite")]

    cases["real h100, 8 ranks"] = sorted(H100.glob("rank*.sqlite"))
    cases["real h100 NCCL, 2 GPUs"] = [NCCL]
    merged = copy(h[0], root / "merged" / "job.sqlite")
    cases["two ranks merged into one file"] = [merge(merged, h[1])]
    per_op = copy(h[0], root / "per_op" / "job.sqlite")
    cases["two ranks in one file, per-op NVTX names"] = [nvtx_names(merge(per_op, h[1]), "unique", keep="step")]
    cases["per-op NVTX names"] = [nvtx_names(p, "unique", keep="step") for p in two("per_op_ranks")]
    cases["every NVTX name unique"] = [nvtx_names(p, "unique") for p in two("unique")]
    cases["NVTX names only in text"] = [nvtx_names(p, "text") for p in two("text")]
    cases["NVTX names only through textId"] = [nvtx_names(p, "textId") for p in two("textid")]
    cases["NVTX names NULL"] = [nvtx_names(p, "null") for p in two("null_names")]
    no_kernels = two("no_kernels")
    edit(no_kernels[1], "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
    cases["a rank with no kernels"] = no_kernels
    cases["one iteration only"] = [first_iterations(p, 1) for p in two("one_iteration")]
    uneven = two("uneven")
    first_iterations(uneven[1], 30)
    cases["ranks with different iteration counts"] = uneven
    cases["runtime table missing"] = [edit(p, "DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME") for p in two("no_runtime")]
    cases["NVTX table empty"] = [edit(p, "DELETE FROM NVTX_EVENTS") for p in two("no_nvtx")]
    cases["every event table empty"] = [edit(p, *[f"DELETE FROM {t}" for t in EVENT_TABLES]) for p in two("empty")]
    cases["zero-length and reversed events"] = [odd_times(p) for p in two("odd_times")]
    cases["names with invalid UTF-8"] = [bad_utf8(p) for p in two("bad_utf8")]
    memory = two("memory")
    plant_memory(memory[0], leak=MIB, leak_steps=range(5, 9))
    cases["memory events on one rank of two"] = memory
    return cases


MEMORY_TABLE = """CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (
    start INTEGER NOT NULL, globalPid INTEGER, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    address INTEGER NOT NULL, pc INTEGER NOT NULL, bytes INTEGER NOT NULL, memKind INTEGER NOT NULL,
    memoryOperationType INTEGER NOT NULL, name TEXT, correlationId INTEGER, streamId INTEGER,
    localMemoryPoolAddress INTEGER, localMemoryPoolReleaseThreshold INTEGER, localMemoryPoolSize INTEGER,
    localMemoryPoolUtilizedSize INTEGER, importedMemoryPoolAddress INTEGER, importedMemoryPoolProcessId INTEGER)"""
MIB = 1 << 20


def first_call_in(con: sqlite3.Connection, phase: str) -> list[tuple[int, int, int]]:
    """Per step, in order: (start, correlationId, globalTid) of the first runtime call inside the step's `phase`
    range, on that range's thread."""
    return con.execute(f"""
        SELECT (SELECT r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.globalTid = n.globalTid
                  AND r.start >= n.start AND r.end <= n.end ORDER BY r.start LIMIT 1),
               (SELECT r.correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.globalTid = n.globalTid
                  AND r.start >= n.start AND r.end <= n.end ORDER BY r.start LIMIT 1), n.globalTid
        FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
        WHERE coalesce(n.text, s.value) = '{phase}' ORDER BY n.start""").fetchall()


def plant_memory(path: Path, activation: int = 512 * MIB, leak: int = 0, leak_steps: range = range(0),
                 weights: int = 2048 * MIB, before: int = 256 * MIB) -> dict:
    """CUDA memory usage events planted into a real export, as `nsys profile --cuda-memory-usage=true` records them
    (device memory, kind 2), each made by a real runtime call of the export (its correlationId, just after its start):
    `weights` allocated before the first step, a free of `before` bytes the capture never saw allocated, `activation`
    allocated at the first call in each step's forward and freed at the first call in its optimizer, and `leak`
    bytes allocated at the first call in backward of the steps in `leak_steps`, never freed. Returns the plan."""
    con = sqlite3.connect(path)
    pid = con.execute("SELECT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()[0]
    first = con.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    forward, backward, optimizer = (first_call_in(con, p) for p in ("forward", "backward", "optimizer"))
    rows = [(first + 1, 0x7000_0000_0000, before, 1, 0), (first + 2, 0x7100_0000_0000, weights, 0, 0)]
    for k, ((fs, fc, _), (bs, bc, _), (os_, oc, _)) in enumerate(zip(forward, backward, optimizer, strict=True)):
        rows.append((fs + 1, 0x7200_0000_0000 + k * (1 << 32), activation, 0, fc))
        rows.append((os_ + 1, 0x7200_0000_0000 + k * (1 << 32), activation, 1, oc))
        if k in leak_steps:
            rows.append((bs + 1, 0x7300_0000_0000 + k * (1 << 32), leak, 0, bc))
    con.execute(MEMORY_TABLE)
    con.executemany("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, address, pc, "
                    "bytes, memKind, memoryOperationType, correlationId, localMemoryPoolAddress, localMemoryPoolSize) "
                    "VALUES (?, ?, 0, 1, ?, 0, ?, 2, ?, ?, 0, 0)",
                    [(t, pid, address, size, op, corr) for t, address, size, op, corr in rows])
    con.commit()
    con.close()
    return {"weights": weights, "before": before, "activation": activation, "leak": leak,
            "leak_steps": list(leak_steps), "steps": len(forward)}
