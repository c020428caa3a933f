"""pandas imported on first use, not when the pack is imported.

Importing pandas takes about 0.3 s of CPU. For a recipe whose per-rank map works on Arrow and NumPy only,
the runner forks its workers before pandas is imported and imports it in the parent while they map.
"""

from __future__ import annotations

import importlib


class _OnFirstUse:
    def __init__(self, name: str):
        self._module_name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._module_name), attr)


pd = _OnFirstUse("pandas")
