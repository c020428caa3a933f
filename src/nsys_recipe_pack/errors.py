"""Errors the command line turns into one line on stderr and an exit code."""

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
