"""One error hierarchy. The CLI is the only place that catches SparklabError."""

from __future__ import annotations


class SparklabError(Exception):
    """An error the user can act on: a message plus, where known, the fix."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n{self.hint}" if self.hint else self.message


class RecipeError(SparklabError):
    """A recipe or override is invalid (names the file, the key path and the fix)."""

    exit_code = 2


class PreflightError(SparklabError):
    """A check before any container starts failed."""

    exit_code = 3


class ServerError(SparklabError):
    """A server could not be started, reached or kept: its runtime refused it, or it died (any runtime)."""

    exit_code = 4


class ContainerError(ServerError):
    """Docker refused, a pull failed, or a container could not be found or removed."""


class ImageUnavailableError(ContainerError):
    """The registry has no such image (or refuses it): another tag may still work."""


class NotReadyError(ServerError):
    """The server did not become ready or stopped serving: it exited, logged a fatal error, went silent while
    loading, or the deadline passed."""

    def __init__(self, message: str, hint: str | None = None, exit_code: int | None = None,
                 log_tail: str = "", oom_killed: bool | None = None, kind: str | None = None) -> None:
        super().__init__(message, hint)
        self.container_exit_code = exit_code
        self.log_tail = log_tail
        self.oom_killed = oom_killed  # Docker's State.OOMKilled (None: not read): the OOM killer, not any SIGKILL
        self.kind = kind  # "fatal" (a fatal engine log line), "stalled" (silent while loading), None: exit/deadline


class MemoryFloorError(ServerError):
    """MemAvailable fell under the floor: sparklab stopped the server before the host could wedge."""


class EngineUnreachable(Exception):
    """An engine did not answer an HTTP request (refused, reset, timed out); internal, never shown raw."""


class IncompleteRunError(SparklabError):
    """A run that cannot go on now (its hosts gone): what it measured is kept, and the same command continues it.
    Its exit code is an incomplete sweep's."""

    exit_code = 6


class DiskFullError(SparklabError):
    """The disk under the runs directory is (nearly) full: the sweep stops cleanly, resumable."""

    exit_code = 7
