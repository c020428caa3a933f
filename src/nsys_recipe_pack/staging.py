"""Atomic output: every folder the pack writes for a user appears whole or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from .errors import UsageError

# set when a signal asked the command to stop (cli.py's handlers): the KeyboardInterrupt they raise can land where
# Python drops it (in a finalizer the garbage collector runs), and no output is made whole after it all the same
STOP = threading.Event()


@contextlib.contextmanager
def staged_output(output: Path, replace: bool = False) -> Iterator[Path]:
    """A fresh hidden folder beside `output` to write into. When the block ends it takes `output`'s place in one
    rename; an existing `output` is replaced only with `replace` (else a usage error), and goes only once the new
    one is whole. When the block fails or is interrupted the folder is removed and `output` left as it was."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    staged = output.parent / f".{output.name}.partial-{uuid.uuid4().hex[:12]}"
    staged.mkdir()  # unlike tempfile.mkdtemp, with the user's umask: the output is as readable as any folder
    try:
        yield staged
        if STOP.is_set():
            raise KeyboardInterrupt
        if not output.exists() and not output.is_symlink():
            os.replace(staged, output)
            return
        if not replace:
            raise UsageError(f"{output}: output folder already exists; pass --force-overwrite")
        trash = output.parent / f".{output.name}.old-{os.getpid()}"
        os.replace(output, trash)
        os.replace(staged, output)
        if trash.is_dir() and not trash.is_symlink():
            shutil.rmtree(trash, ignore_errors=True)
        else:
            trash.unlink()
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
