"""Where the pack's recipe folders and notebooks live, installed or in a checkout."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _find(name: str) -> Path:
    installed = _PKG / "_data" / name
    if installed.is_dir():
        return installed
    checkout = _PKG.parent.parent / name
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"the pack's {name}/ folder is missing from {_PKG}; reinstall nsys-recipe-pack")


def recipes_dir() -> Path:
    return _find("recipes")


def notebooks_dir() -> Path:
    return _find("notebooks")


def notebook_path(name: str) -> Path:
    return notebooks_dir() / f"{name}.ipynb"
