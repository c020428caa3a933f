"""Progress for multi-rank work: a bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys


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
