"""Progress for multi-rank work: a bar on a terminal, plain lines otherwise; and for single long steps."""

from __future__ import annotations

import contextlib
import sys
import threading
import time


def iterate(items, total: int, desc: str, stream=None):
    if total <= 1:
        yield from items
        return
    bar = Counter(total, desc, stream)
    try:
        for item in items:
            yield item
            bar.advance(1)
    finally:
        bar.close()


class Counter:
    """Progress advanced by several items at a time (work done in batches)."""

    def __init__(self, total: int, desc: str, stream=None):
        self.total, self.desc, self.done = total, desc, 0
        self.stream = stream or sys.stderr
        self._bar = None
        self._step = max(1, total // 10)
        self._next = self._step
        if total > 1 and self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="item", file=self.stream)

    def advance(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.total > 1 and (self.done >= self._next or self.done == self.total):
            print(f"{self.desc}: {self.done}/{self.total} done", file=self.stream, flush=True)
            while self._next <= self.done:
                self._next += self._step

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@contextlib.contextmanager
def step(desc: str, stream=None, every: float = 10.0):
    """A step that can take a while (an `nsys recipe` run, a notebook): a line when it starts, one every
    `every` seconds while it runs, and one with its duration when it ends."""
    stream = stream or sys.stderr
    start = time.monotonic()
    print(f"{desc} ...", file=stream, flush=True)
    stop = threading.Event()

    def tick():
        while not stop.wait(every):
            print(f"{desc}: {time.monotonic() - start:.0f} s so far", file=stream, flush=True)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    ended = "stopped after"
    try:
        yield
        ended = "done in"
    finally:
        stop.set()
        ticker.join()
        print(f"{desc}: {ended} {time.monotonic() - start:.1f} s", file=stream, flush=True)
