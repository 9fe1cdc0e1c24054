"""A dead engine in a live container (issue 12, part 1): fatal log lines end a wait within seconds, with the
cause; silence while loading ends it as "stalled". Fake probes and a fake clock: no Docker, no waiting."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sparklab.engines import engine
from sparklab.engines.base import root_cause
from sparklab.engines.logwatch import FATAL_GRACE_S, LogWatch
from sparklab.errors import NotReadyError
from sparklab.runtimes.health import wait_ready

# Lines exactly as vLLM 0.27.1 prints them (process prefix from vllm/utils/system_utils.py _add_prefix, format
# from vllm/logger.py), with the traceback logger.exception adds after the message.
# Real lines of vLLM 0.27.1 (CPU build) compiling without a C++ compiler, as this machine printed them (cut).
W = "(Worker pid=38) ERROR 11-30 15:12:42 [multiproc_executor.py:1018] "
E = "(EngineCore pid=25) ERROR 11-30 15:12:42 [core.py:1349] "
NO_COMPILER = "InvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx: (None, 'g++')"
VLLM_WORKER_FAILED = W + "WorkerProc hit an exception."
VLLM_START_FAILED = E + "EngineCore failed to start."
VLLM_START_TRACEBACK = [
    VLLM_WORKER_FAILED,
    W + "Traceback (most recent call last):",
    W + '  File "/opt/vllm/lib/python3.11/site-packages/vllm/v1/executor/multiproc_executor.py", line 1010, in '
        "worker_busy_loop",
    W + "    output = func(*args, **kwargs)",
    W + "    raise InductorError(e, currentframe()).with_traceback(",
    W + "torch._inductor.exc.InductorError: " + NO_COMPILER,
    W,
    VLLM_START_FAILED,
    E + "Traceback (most recent call last):",
    E + "    raise RuntimeError(",
    E + f"RuntimeError: Worker failed with error '{NO_COMPILER}', please check the stack trace above for the root "
        "cause",
    "(Worker pid=38) Exception ignored in: <function WeakIdKeyDictionary.__init__.<locals>.remove at 0x7f9fffa6b060>",
    "(Worker pid=38) Traceback (most recent call last):",
    "(Worker pid=38)     raise SystemExit()",
    "(Worker pid=38) SystemExit: ",
]
VLLM_FATAL = [
    VLLM_START_FAILED,
    "(EngineCore pid=229) ERROR 11-30 15:30:02 [core.py:1351] EngineCore encountered a fatal error.",
    "(APIServer pid=7) RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {'EngineCore': 1}",
    "(APIServer pid=7) WARNING 11-30 15:30:02 [core_client.py:725] [shutdown] MPClient: engine core exited "
    "unexpectedly; starting cleanup",
    "(APIServer pid=7) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
    "trace (above) for the root cause.",
    "(APIServer pid=7) ERROR 11-30 15:30:02 [async_llm.py:724] AsyncLLM output_handler failed.",
    "(EngineCore pid=229) RuntimeError: Worker failed with error 'CUDA error: an illegal memory access', please "
    "check the stack trace above for the root cause",
    "(Worker pid=301) ERROR 11-30 15:30:02 [multiproc_executor.py:912] WorkerProc failed to start.",
    "(Worker pid=301) ERROR 11-30 15:30:02 [multiproc_executor.py:1018] WorkerProc hit an exception.",
    "(EngineCore pid=229) ERROR 11-30 15:30:02 [multiproc_executor.py:295] Worker proc VllmWorker-0 died "
    "unexpectedly (exit code: -9), shutting down executor.",
]
SGLANG_FATAL = [
    "[2026-11-30 15:30:02 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    "[2026-11-30 15:30:02] DetokenizerManager hit an exception: Traceback (most recent call last):",
    "[2026-11-30 15:30:02] TokenizerManager hit an exception: Traceback (most recent call last):",
    "[2026-11-30 15:30:02] DataParallelController hit an exception: Traceback (most recent call last):",
    "[2026-11-30 15:30:02] Received sigquit from a child process. It usually means the child failed.",
    "[2026-11-30 15:30:02] SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
    "[2026-11-30 15:30:02] Subprocess scheduler_0 (pid=88) crashed with exit code -9. Triggering SIGQUIT for "
    "cleanup...",
    "[2026-11-30 15:30:02] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)",
]
HARMLESS = [
    "(EngineCore pid=229) INFO 11-30 15:12:09 [core.py:93] Initializing a V1 LLM engine (v0.27.1) with config: ...",
    "(APIServer pid=7) INFO:     Application startup complete.",
    "(APIServer pid=7) WARNING 11-30 15:11:44 [system_utils.py:299] Found ulimit of 20000 and failed to "
    "automatically increase with error current limit exceeds maximum limit.",
    "(EngineCore pid=229) ERROR 11-30 15:40:00 [core.py:1833] Unexpected error pre-processing request cmpl-1",
    "[2026-11-30 15:30:02] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=True)",
    "[2026-11-30 15:30:02] The server is fired up and ready to roll!",
]


@pytest.mark.parametrize("line", VLLM_FATAL)
def test_vllm_fatal_lines_from_its_source(line: str) -> None:
    assert engine("vllm").fatal(line) is not None


@pytest.mark.parametrize("line", SGLANG_FATAL)
def test_sglang_fatal_lines_from_its_source(line: str) -> None:
    assert engine("sglang").fatal(line) is not None


@pytest.mark.parametrize("line", HARMLESS)
def test_ordinary_lines_are_not_fatal(line: str) -> None:
    assert engine("vllm").fatal(line) is None and engine("sglang").fatal(line) is None


def test_root_cause_is_the_first_exception_after_the_fatal_line() -> None:
    log = "\n".join(["(APIServer pid=7) ValueError: an earlier, unrelated error", *VLLM_START_TRACEBACK])
    assert root_cause(log, VLLM_WORKER_FAILED) == "torch._inductor.exc.InductorError: " + NO_COMPILER
    assert root_cause(log, VLLM_START_FAILED) == (
        f"RuntimeError: Worker failed with error '{NO_COMPILER}', please check the stack trace above for the root "
        "cause")


def test_the_watch_finds_a_fatal_line_however_the_stream_cuts_it() -> None:
    watch = LogWatch(engine("vllm"))
    text = ("(APIServer pid=7) INFO 11-30 15:11:40 [api_server.py:1839] vLLM API server version 0.27.1\n"
            + "\n".join(VLLM_START_TRACEBACK) + "\n").encode()
    for i in range(0, len(text), 7):  # 7-byte pieces: lines cut anywhere
        watch.feed(text[i:i + 7])
    assert watch.fatal == VLLM_WORKER_FAILED  # the first fatal line
    assert watch.meaning == "a vLLM worker died"
    assert watch.output > 1


def test_on_fatal_is_called_once_even_when_registered_late() -> None:
    watch = LogWatch(engine("sglang"))
    calls: list[str] = []
    watch.on_fatal(lambda: calls.append("early"), after_s=0)
    watch.feed(SGLANG_FATAL[0] + "\n")
    watch.feed(SGLANG_FATAL[1] + "\n")
    watch.on_fatal(lambda: calls.append("late"), after_s=0)
    for _ in range(100):
        if len(calls) == 2:
            break
        import time

        time.sleep(0.01)
    assert sorted(calls) == ["early", "late"]
    assert watch.fatal == SGLANG_FATAL[0]


# -- wait_ready with a fake clock ---------------------------------------------------------------------------


class Clock:
    """A fake monotonic clock; `sleep` advances it and feeds the log lines due by then."""

    def __init__(self, feed: Callable[[float], None] = lambda now: None) -> None:
        self.now = 1000.0
        self.feed = feed

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.01)
        self.feed(self.now - 1000.0)


class Container:
    """Runs until `exit_at` (fake seconds after start), then reports `code`; its log tail is what was fed."""

    def __init__(self, clock: Clock, watch: LogWatch, exit_at: float | None = None, code: int = 1) -> None:
        self.clock, self.watch, self.exit_at, self.code = clock, watch, exit_at, code
        self.lines: list[str] = []

    def state(self) -> tuple[bool, int | None]:
        if self.exit_at is not None and self.clock.now - 1000.0 >= self.exit_at:
            return False, self.code
        return True, None

    def log_tail(self, lines: int = 50) -> str:
        return "\n".join(self.lines[-lines:])


NOBODY = "http://127.0.0.1:9/v1/models"  # refused at once: the engine never listens


def _scripted(script: dict[float, list[str]], every_s: float | None = None):
    """A clock and a container whose log gets `script[t]` at fake second t (and a loading line every_s)."""
    watch = LogWatch(engine("vllm"))
    container: Container | None = None
    due = sorted(script.items())
    last = [0.0]

    def feed(elapsed: float) -> None:
        assert container is not None
        while due and due[0][0] <= elapsed:
            for line in due.pop(0)[1]:
                container.lines.append(line)
                watch.feed(line + "\n")
        if every_s is not None and elapsed - last[0] >= every_s:
            last[0] = elapsed
            line = f"Loading safetensors checkpoint shards: 0% Completed | 0/4 [{elapsed:.0f}s<?, ?it/s]"
            container.lines.append(line)
            watch.feed(line + "\n")

    clock = Clock(feed)
    container = Container(clock, watch)
    return clock, container, watch


def test_a_fatal_line_in_a_live_container_ends_the_wait_within_seconds_with_the_cause() -> None:
    """Before: the wait ran to its 1800 s deadline and advised --ready-timeout (issue 12's reproduction)."""
    clock, container, watch = _scripted({80.0: VLLM_START_TRACEBACK})
    with pytest.raises(NotReadyError) as exc:
        wait_ready(container, NOBODY, kind="vllm", timeout_s=1800, clock=clock, sleep=clock.sleep, watch=watch)
    waited = clock.now - 1000.0
    assert 80 <= waited <= 85
    error = exc.value
    assert error.kind == "fatal"
    assert VLLM_WORKER_FAILED in error.message.splitlines()[0]
    assert "before it was ready" in error.message and "kept running" in error.message
    assert "Last 50 log lines" in error.message and VLLM_START_FAILED in error.message
    assert error.hint is not None and "--ready-timeout" not in error.hint
    assert "compiler" in error.hint and "--enforce-eager" in error.hint  # the known cause, named
    assert "InductorError: InvalidCxxCompiler" in error.hint  # the engine's own words
    assert error.log_tail.endswith("SystemExit: ")


def test_the_fatal_cause_without_a_known_explanation_is_the_engines_own_error() -> None:
    lines = [VLLM_START_FAILED, "(EngineCore pid=229) ERROR 11-30 15:12:41 [core.py:1349] KeyError: 'mystery'"]
    clock, container, watch = _scripted({5.0: lines})
    with pytest.raises(NotReadyError) as exc:
        wait_ready(container, NOBODY, kind="vllm", timeout_s=1800, clock=clock, sleep=clock.sleep, watch=watch)
    assert exc.value.hint is not None
    assert "What died: vLLM's engine core failed to start; its error: KeyError: 'mystery'" in exc.value.hint
    assert "KeyError: 'mystery'" in exc.value.hint


def test_a_container_that_exits_after_its_fatal_line_is_reported_by_its_exit_code() -> None:
    clock, container, watch = _scripted({10.0: VLLM_START_TRACEBACK})
    container.exit_at, container.code = 10.2, 1
    with pytest.raises(NotReadyError) as exc:
        wait_ready(container, NOBODY, kind="vllm", timeout_s=1800, clock=clock, sleep=clock.sleep, watch=watch)
    assert exc.value.kind is None and exc.value.container_exit_code == 1
    assert "exited with code 1 before it was ready" in exc.value.message
    assert VLLM_WORKER_FAILED in exc.value.message


def test_silence_while_loading_fails_as_stalled() -> None:
    """Lines until 30 s, then nothing: with stall_s=120 the wait ends at ~150 s, not at the 1800 s deadline."""
    lines = {float(t): [f"(EngineCore pid=229) INFO loading {t}"] for t in range(1, 31)}
    clock, container, watch = _scripted(lines)
    with pytest.raises(NotReadyError) as exc:
        wait_ready(container, NOBODY, kind="vllm", timeout_s=1800, clock=clock, sleep=clock.sleep, watch=watch,
                   stall_s=120)
    assert 150 <= clock.now - 1000.0 <= 152
    assert exc.value.kind == "stalled"
    assert "printed nothing for 120 s" in exc.value.message and "loading 30" in exc.value.message
    assert exc.value.hint is not None and "--stall-timeout" in exc.value.hint and "load_stall_s" in exc.value.hint


def test_a_slow_load_that_keeps_printing_is_not_stalled() -> None:
    clock, container, watch = _scripted({}, every_s=30)
    with pytest.raises(NotReadyError) as exc:
        wait_ready(container, NOBODY, kind="vllm", timeout_s=600, clock=clock, sleep=clock.sleep, watch=watch,
                   stall_s=60)
    assert exc.value.kind is None and "not ready after 600 s" in exc.value.message


def test_no_stall_detector_unless_asked() -> None:
    clock, container, watch = _scripted({})
    with pytest.raises(NotReadyError) as exc:
        wait_ready(container, NOBODY, kind="vllm", timeout_s=900, clock=clock, sleep=clock.sleep, watch=watch)
    assert exc.value.kind is None and "not ready after 900 s" in exc.value.message


def test_fatal_grace_keeps_within_the_five_second_promise() -> None:
    assert 0 < FATAL_GRACE_S <= 2
