"""Errors of the job system, and how a job's exception becomes one clear message.

Every error a user can cause derives from :class:`JobsError` and carries a message that names
the cause and the fix; the CLI prints it as one line, the app shows it as is.
"""

from __future__ import annotations

import errno
import traceback

from core.config import ConfigError as CoreConfigError
from core.config import FieldChange


class JobsError(Exception):
    """Base class: a user-facing error of the job system."""


class DatabaseBusyError(JobsError):
    """The database stayed locked by another process for longer than the retry budget."""


class DatabaseDamagedError(JobsError):
    """The database file is not a database or is corrupt; the message says how to start afresh."""


class JobNotFound(JobsError):
    def __init__(self, job_id: int):
        super().__init__(f"no job with id {job_id}; `lolcats jobs list` shows the existing jobs")
        self.job_id = job_id


class UnknownKind(JobsError):
    pass


class ConfigError(JobsError, CoreConfigError):
    """A job config failed validation. ``problems`` lists ``(field, message)`` pairs.

    Also a :class:`core.config.ConfigError`, so core's error handling shows it as one line too.
    """

    def __init__(self, kind: str, problems: list[tuple[str, str]]):
        self.kind = kind
        self.problems = problems
        lines = "; ".join(f"{field}: {message}" for field, message in problems)
        super().__init__(f"invalid {kind} config: {lines}")


class InvalidTransition(JobsError):
    """A state change was refused because the job is not in the required state."""


class ResumeConfigMismatch(JobsError):
    """Resume was asked with a config that changes what the job trained."""

    def __init__(self, job_id: int, changes: list[FieldChange]):
        self.job_id = job_id
        self.changes = changes
        diff = "; ".join(str(c) for c in changes)
        super().__init__(
            f"job {job_id} cannot resume with this config: it changes what was trained ({diff}); "
            "resume with the original values, or submit a new job"
        )


OOM_HINT = (
    "out of memory: the job needed more memory than the device or host had. "
    "Fix: lower batch_size or seq_len (or use a smaller model / fewer layers per block), then resume."
)


def is_out_of_memory(exc: BaseException) -> bool:
    """MemoryError, torch's OutOfMemoryError, or a RuntimeError from an allocator that ran out."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    message = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in message or "can't allocate memory" in message or "failed to allocate" in message
    )


def describe_failure(exc: BaseException) -> str:
    """The one-line message stored as a failed job's ``error``."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" writing {exc.filename}" if exc.filename else ""
        return (f"the disk is full ({exc.strerror}{where}). Fix: free space on that disk (or move the workspace), "
                "then resume: what the job saved before is kept")
    if is_out_of_memory(exc):
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"{OOM_HINT} ({type(exc).__name__}: {detail[:300]})"
    text = str(exc).strip() or "(no message)"
    return f"{type(exc).__name__}: {text[:2000]}"


def traceback_tail(exc: BaseException, max_lines: int = 40) -> str:
    lines = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    return "\n".join(lines[-max_lines:])
