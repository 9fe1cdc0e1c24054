"""Console progress for image pulls and model downloads (rich). Library code never prints; the CLI passes this in."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class PullProgress:
    """One bar per layer. Events without a total (containerd extraction, "Waiting") stay indeterminate."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
            console=console, transient=True)
        self.tasks: dict[str, TaskID] = {}
        self.started = False

    def update(self, layer: str, status: str, current: int | None, total: int | None) -> None:
        if not layer or status.startswith(("Pulling from", "Digest:", "Status:")):
            return
        if not self.started:
            self.progress.start()
            self.started = True
        label = f"{layer[:12]} {status.split(' ')[0].lower()}"
        if layer not in self.tasks:
            self.tasks[layer] = self.progress.add_task(label, total=None)
        task = self.tasks[layer]
        if total:
            self.progress.update(task, description=label, completed=current or 0, total=total)
        elif status.startswith(("Pull complete", "Already exists", "Download complete")):
            self.progress.update(task, description=label, completed=1, total=1)
        else:
            self.progress.update(task, description=label)

    def __enter__(self) -> PullProgress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.started:
            self.progress.stop()


class DownloadProgress:
    """One bar per model repository: bytes written of the snapshot's total, and files finished of all."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
            TimeRemainingColumn(), console=console, transient=False)
        self.tasks: dict[str, TaskID] = {}
        self.started = False

    @classmethod
    def to_stderr(cls) -> DownloadProgress:
        return cls(Console(stderr=True, highlight=False, soft_wrap=True))

    def say(self, message: str) -> None:
        self.console.print(message, markup=False, highlight=False)

    def update(self, event: Any) -> None:
        """A hub.Progress: repo_id, files_done, files_total, bytes_done, bytes_total."""
        if not self.started:
            self.progress.start()
            self.started = True
        label = f"{event.repo_id} {event.files_done}/{event.files_total if event.files_total else '?'} files"
        if event.repo_id not in self.tasks:
            self.tasks[event.repo_id] = self.progress.add_task(label, total=None)
        self.progress.update(self.tasks[event.repo_id], description=label, completed=event.bytes_done,
                             total=event.bytes_total)

    def __enter__(self) -> DownloadProgress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.started:
            self.progress.stop()
