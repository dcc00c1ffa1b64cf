"""The exceptions hookcli raises, one class per exit status (docs/reference.md).

    HookcliError              (base; never raised itself)
     +-- UsageError           exit 2: bad option, bad input spec, no input known
     +-- LoadError            exit 3: the model could not be built or its weights loaded
     +-- RunError             exit 4: forward or backward raised inside the model
     +-- ResourceError        exit 5: out of memory, or an estimate over --max-memory

Exit status 1 (a check failed) is not an error: the report is complete and
carries the failed checks. Foreign exceptions are wrapped once, where they
enter hookcli, with ``raise ... from err``; ``hookcli.cli`` alone turns these
classes into exit statuses.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_LOAD = 3
EXIT_RUN = 4
EXIT_RESOURCE = 5
EXIT_INTERRUPTED = 130


class HookcliError(Exception):
    """Base of every error hookcli reports to the user as one line."""

    exit_code: int = EXIT_USAGE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(HookcliError):
    """Bad option, bad input spec, or no input known for the model (exit 2)."""

    exit_code = EXIT_USAGE


class LoadError(HookcliError):
    """The model could not be built: unknown name, import, constructor, weights (exit 3)."""

    exit_code = EXIT_LOAD


class RunError(HookcliError):
    """The model raised while running; ``module`` names where (exit 4)."""

    exit_code = EXIT_RUN

    def __init__(self, message: str, module: str | None = None) -> None:
        super().__init__(message)
        self.module = module


class ResourceError(HookcliError):
    """Out of memory, or an estimate over ``--max-memory`` (exit 5)."""

    exit_code = EXIT_RESOURCE


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message, with its class name."""
    text = str(err).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(err).__name__}: {line}" if line else type(err).__name__
