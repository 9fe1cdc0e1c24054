"""Console progress for image pulls (rich). Library code never prints; the CLI passes this in."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
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
