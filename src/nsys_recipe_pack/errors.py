"""Errors the command line turns into one line on stderr and an exit code."""

import os
import traceback

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_BAD_INPUT = 3
EXIT_MISSING_TOOL = 4


class PackError(Exception):
    """An error the user can act on; `exit_code` is one of the exit codes the README lists."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(PackError):
    exit_code = EXIT_USAGE


class BadInputError(PackError):
    exit_code = EXIT_BAD_INPUT


class MissingToolError(PackError):
    exit_code = EXIT_MISSING_TOOL


class MissingTraceError(BadInputError):
    """A rank lacks a trace the recipe needs; the run fails only if every rank lacks it."""


class NotApplicableError(MissingTraceError):
    """The run holds nothing the recipe speaks of (no NCCL kernels for comm_overlap): said instead of empty tables."""


def one_line(exc: BaseException) -> str:
    """What a recipe that could not run says where the others go on (`run` with several, `report`): the pack's own
    message, or an internal error in one line (NSYS_RECIPE_DEBUG=1 prints its traceback too)."""
    if isinstance(exc, PackError):
        return str(exc)
    if os.environ.get("NSYS_RECIPE_DEBUG"):
        traceback.print_exception(exc)
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"internal error: {type(exc).__name__}: {first}"
