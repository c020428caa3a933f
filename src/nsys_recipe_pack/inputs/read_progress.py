"""What a read of one rank may cost before it starts (`check_memory`: refuse a rank the machine cannot hold) and how
far it has gone while it runs (`ReadProgress`: a line now and then on a long read)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from ..errors import BadInputError

# Peak memory of a recipe over one rank per event row it reads, where the recipe does not say its own (each
# says what it was measured to take on the long captures of bench/RESULTS.md, with some margin)
BYTES_PER_ROW = 400
LONG_READ_ROWS = 2_000_000  # a read of more rows than this reports its progress
PROGRESS_EVERY_S = 10


def check_memory(path: Path, counts: dict[str, int], available: int | None = None,
                 bytes_per_row: int | None = None) -> None:
    """Refuse a rank the machine cannot hold, naming the file and the memory it would need, instead of being
    killed for it (or swapping) minutes later. NSYS_RECIPE_MEMORY_GB sets the memory the pack may use."""
    rows = sum(counts.values())
    need = rows * (bytes_per_row or BYTES_PER_ROW)
    if available is None:
        told = os.environ.get("NSYS_RECIPE_MEMORY_GB", "").strip()
        if told:
            available = int(float(told) * 2**30)
        else:
            import psutil

            available = psutil.virtual_memory().available
    if need > available:
        biggest = ", ".join(f"{t} {n / 1e6:.1f} M" for t, n in sorted(counts.items(), key=lambda x: -x[1])[:3] if n)
        raise BadInputError(f"{path}: this rank needs about {need / 2**30:.1f} GB of memory ({rows / 1e6:.1f} M rows: "
                            f"{biggest}) and {available / 2**30:.1f} GB is free; run it on a machine with more memory, "
                            "or profile a shorter span (nsys profile --duration, --capture-range); "
                            "NSYS_RECIPE_MEMORY_GB=N lets the pack use N GB")


class ReadProgress:
    """One long read (millions of rows): a line when it starts, and after each table the rows read so far and
    the time left at that pace. Silent for the usual small reports. The tables of a read in spans are read in
    threads of their own (inputs.chunks.time_chunks), which count here together."""

    def __init__(self, path: Path, counts: dict[str, int], stream=None):
        self.path, self.counts, self.lock = path, counts, threading.Lock()
        self.total = sum(counts.values())
        self.read = 0
        self.start = self.said = time.monotonic()
        self.table_read: dict[str, int] = {}
        self.stream = stream or sys.stderr
        if self.total >= LONG_READ_ROWS:
            print(f"{path}: reading {self.total / 1e6:.1f} M rows", file=self.stream, flush=True)

    def __call__(self, table: str) -> None:
        with self.lock:
            self.read += self.counts.get(table, 0)
            self._say()

    def expect(self, table: str, rows: int) -> None:
        """A read not counted when the progress began (a table read again)."""
        with self.lock:
            self.counts[table] = self.counts.get(table, 0) + rows
            self.total += rows

    def add(self, table: str, rows: int) -> None:
        """Rows of a table read a batch at a time: a line every PROGRESS_EVERY_S seconds and at its end."""
        with self.lock:
            self.read += rows
            self.table_read[table] = self.table_read.get(table, 0) + rows
            if self.table_read[table] >= self.counts.get(table, 0) or time.monotonic() - self.said >= PROGRESS_EVERY_S:
                self._say()

    def _say(self) -> None:
        self.said = time.monotonic()
        if self.total < LONG_READ_ROWS:
            return
        spent = time.monotonic() - self.start
        left = spent * (self.total - self.read) / max(self.read, 1)
        print(f"{self.path}: {self.read / 1e6:.1f} M of {self.total / 1e6:.1f} M rows read in {spent:.0f} s"
              + (f", about {left:.0f} s left" if self.read < self.total else ""), file=self.stream, flush=True)
