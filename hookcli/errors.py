"""The exceptions hookcli raises, one class per exit status (docs/reference.md).

    HookcliError              (base; never raised itself)
     +-- UsageError           exit 2: bad option, bad input spec, no input known
     |    +-- UnknownOptionError  the Python API called with a keyword it lacks (also TypeError)
     +-- LoadError            exit 3: the model could not be built or its weights loaded
     +-- RunError             exit 4: forward or backward raised inside the model
     +-- ResourceError        exit 5: out of memory, or an estimate over --max-memory
     +-- InternalError        exit 70: hookcli's own code failed (never the model's fault)

    SystemExit
     +-- ModelExit            os._exit called by the model: reported as exit 4

    KeyboardInterrupt         exit 130: SIGINT (Ctrl-C)
     +-- Terminated           exit 143: SIGTERM, raised where the program is, like Ctrl-C

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
EXIT_INTERNAL = 70  # sysexits.h EX_SOFTWARE: a bug in hookcli, not in the model
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

_OOM_MARKERS = ("out of memory", "can't allocate memory", "not enough memory")


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


class UnknownOptionError(UsageError, TypeError):
    """A Python API function called with a keyword it does not take, or with its arguments
    wrong (``hookcli.inspect(model, x, bogus=1)``). A ``UsageError`` like every bad option,
    and a ``TypeError`` as Python raises for any such call, so either ``except`` catches it."""


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


class InternalError(HookcliError):
    """hookcli's own code raised (a probe's hook, a runner): a bug in hookcli, which the
    message says, never blaming the model (exit 70)."""

    exit_code = EXIT_INTERNAL


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message, with its class name."""
    text = str(err).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(err).__name__}: {line}" if line else type(err).__name__


class ModelExit(SystemExit):
    """``os._exit`` called by model code while hookcli runs (the CLI turns the call into
    this): a failure of the model (exit 4), never the process's exit status."""

    def __init__(self, code: object, via: str = "os._exit") -> None:
        super().__init__(code)
        self.via = via


class Terminated(KeyboardInterrupt):
    """SIGTERM: unwinds like Ctrl-C (every ``finally`` runs, the model is restored), exit 143."""


def is_oom(err: BaseException | None) -> bool:
    """An out-of-memory error (MemoryError, torch.OutOfMemoryError, an allocator failure),
    itself or as the cause of the error that wraps it. No torch import."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
            return True
        if isinstance(err, RuntimeError) and any(m in str(err).lower() for m in _OOM_MARKERS):
            return True
        err = err.__cause__ or err.__context__
    return False


def oom_cause(err: BaseException) -> BaseException:
    """The out-of-memory error in ``err``'s chain (``err`` itself when none is found)."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if is_oom(cur) and not is_oom(cur.__cause__ or cur.__context__):
            return cur
        cur = cur.__cause__ or cur.__context__
    return err


def printable(text: str) -> str:
    """Control characters (newline, tab, ESC...) written as escapes, so a name from a
    model never breaks a table row or a one-line message, nor drives the terminal."""
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )


# how much of a user's item a message shows
SHOWN = 100


def clip(text: str, limit: int = SHOWN) -> str:
    """``text``, or its start and end with the length between, where it is longer."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 30]}...{text[-12:]} ({len(text):,} characters)"
