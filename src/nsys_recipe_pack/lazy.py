"""pandas imported on first use, not when the pack is imported.

Importing pandas takes about 0.3 s of CPU. A run over cached exports forks its workers before any pandas
is needed (the per-rank analyses work on Arrow and NumPy) and imports it in the parent while they work.
"""

from __future__ import annotations

import importlib


class _OnFirstUse:
    def __init__(self, name: str):
        self._module_name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._module_name), attr)


pd = _OnFirstUse("pandas")
