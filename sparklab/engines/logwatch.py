"""Following an engine's log as it arrives: its first fatal line, and whether it still prints anything.

An engine can die while its container runs on: vLLM's API server keeps answering /v1/models after its engine
core failed, SGLang's HTTP server after its scheduler died. Docker then says "running" and readiness never
comes, or chat requests hang. The engine's own log says so at once; each adapter lists the lines that mean it
(`Engine.fatal_lines`). A `LogWatch` is fed the container's log stream (container_server.Server's log thread) and
remembers the first such line; readiness waits, `up` in the foreground and the sweep read it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

from sparklab.engines.base import Engine, root_cause
from sparklab.errors import NotReadyError

# After a fatal line the engine still prints its traceback (and its API server the consequence): wait this
# long for it before taking the log tail, so the tail holds the root cause.
FATAL_GRACE_S = 1.0
# A dead engine is killed at once (no SIGTERM grace): its API server hangs (vLLM 0.27.1's sat through a 2 s
# SIGTERM grace here and needed the SIGKILL anyway), and a grace would only delay the error.
DEAD_STOP_GRACE_S = 0.0
TAIL_LINES = 50
CAUSE_LINES = 500  # read this much of the log to find the error behind a fatal line
_LINE_END = re.compile(r"\r\n|\n|\r")  # progress bars redraw with \r


class LogWatch:
    """What an engine's log said so far: how much output came (the stall detector's pulse) and the first fatal
    line. Fed from the log stream's thread, read from others."""

    def __init__(self, adapter: Engine) -> None:
        self.adapter = adapter
        self.output = 0  # pieces of output so far; a stalled engine adds none
        self.fatal: str | None = None  # the first fatal line, as the engine printed it
        self.meaning: str | None = None  # what that line means, in words
        self.quiet: str | None = None  # a phase the engine may spend silent (Engine.quiet_phases), while open
        self._partial = ""
        self._lock = threading.Lock()
        self._callbacks: list[tuple[Callable[[], None], float]] = []

    def feed(self, data: bytes | str) -> None:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        with self._lock:
            self.output += 1
            if self.fatal is not None:
                return
            lines = _LINE_END.split(self._partial + text)
            self._partial = lines[-1][-8192:]
            for line in lines[:-1]:  # whole lines only; the unfinished piece waits for its end
                self._track_quiet(line)
                found = self.adapter.fatal(line)
                if found is not None:
                    self.fatal, self.meaning = line.strip(), found.meaning
                    break
            if self.fatal is None:
                return
            callbacks, self._callbacks = self._callbacks, []
        for callback, after_s in callbacks:
            _later(callback, after_s)

    def _track_quiet(self, line: str) -> None:
        for start, end, what in self.adapter.quiet_phases:
            if start.search(line):
                self.quiet = what
            elif self.quiet == what and end.search(line):
                self.quiet = None

    def on_fatal(self, callback: Callable[[], None], after_s: float = FATAL_GRACE_S) -> None:
        """Call `callback` (in its own thread) `after_s` after the first fatal line, or now if it came already."""
        with self._lock:
            if self.fatal is None:
                self._callbacks.append((callback, after_s))
                return
        _later(callback, after_s)


def _later(callback: Callable[[], None], after_s: float) -> None:
    timer = threading.Timer(after_s, callback)
    timer.daemon = True
    timer.start()


_TAIL_HEADER = re.compile(r"\s*Last \d+ log lines:\s*$")


def headline(message: str, tail: str | None = None) -> str:
    """A failure as one console line: its first line without a dangling "Last N log lines:" (the tail follows it
    only in the full message), ending with the engine's last log line instead."""
    first = _TAIL_HEADER.sub("", (message.strip().splitlines() or [""])[0]).rstrip()
    last = next((line.strip() for line in reversed((tail or "").splitlines()) if line.strip()), "")
    return f"{first} Last log line: {last}" if last and last not in first else first


def indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


def fatal_advice(watch: LogWatch, log: str) -> str:
    """What died, the engine's own error behind it, and what to do: a known cause, or fix that error."""
    known = watch.adapter.explain_failure(log)
    cause = root_cause(log, watch.fatal or "")
    said = f"What died: {watch.meaning or 'the engine'}" + (f"; its error: {cause}" if cause else "") + "."
    if known:
        return f"{said}\nLikely cause: {known}"
    return (f"{said}\nFix what that error names (the recipe's flags, the image, memory) and start again; waiting "
            "longer would not help.")


def fatal_error(watch: LogWatch, log: str, when: str) -> NotReadyError:
    """The engine logged a fatal line and its container kept running. `log`: the last CAUSE_LINES log lines
    (the traceback that names the cause can be long); `when`: e.g. "12 s after start, before it was ready"."""
    tail = "\n".join(log.splitlines()[-TAIL_LINES:])
    return NotReadyError(
        f"the engine logged a fatal error {when}, and its container kept running: {watch.fatal}\n"
        f"Last {TAIL_LINES} log lines:\n{indent(tail)}",
        fatal_advice(watch, log), log_tail=tail, kind="fatal")


def stalled_error(stall_s: float, elapsed_s: float, tail: str) -> NotReadyError:
    return NotReadyError(
        f"the engine printed nothing for {stall_s:.0f} s and is not ready ({elapsed_s:.0f} s after start): it "
        f"looks hung while loading. Last {TAIL_LINES} log lines:\n{indent(tail)}",
        "The last lines say what it was doing. If it is only slow and quiet (a long compile or download), "
        "raise the limit: --stall-timeout SECONDS for `sparklab up`, load_stall_s in a sweep file.",
        log_tail=tail, kind="stalled")
