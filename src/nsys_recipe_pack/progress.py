"""Progress for multi-rank work: a bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys


def iterate(items, total: int, desc: str, stream=None):
    stream = stream or sys.stderr
    if total <= 1:
        yield from items
        return
    if stream.isatty():
        from tqdm import tqdm

        yield from tqdm(items, total=total, desc=desc, unit="item", file=stream)
        return
    step = max(1, total // 10)
    for i, item in enumerate(items, 1):
        yield item
        if i % step == 0 or i == total:
            print(f"{desc}: {i}/{total} done", file=stream, flush=True)
