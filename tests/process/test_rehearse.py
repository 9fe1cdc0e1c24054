"""`sparklab rehearse`: every shipped sweep, `tune gb10`, `up dspark` and the pair run against the DGX Spark twin
with no traceback, no floor trip and no cell lost at shipped settings; a 0.97 memory fraction and each fault make
the night lose something, named, with exit 1. The nights run at once (each its own state directory and ports; most
of their time is the stand-ins' sleeping), compressed hard, so the whole module takes about as long as the longest.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sparklab.recipes.plan import load_sweep, recipe_file
from sparklab.recipes.schema import load_recipe
from tests.dockerkit import SESSION
from tests.process.conftest import REPO, STANDIN, leftovers
from tests.signals import ctrl_c_raises

SWEEPS = sorted((REPO / "recipes" / "sweeps").glob("*.yaml"))
FAULTS = {  # the fault, and what the verdict must name
    "dead-engine": "fatal: the engine logged a fatal error",
    "oom": "memory-floor: MemAvailable fell",
    "disk-full": "disk_full: only",
    "host-lost": "host_lost: the Docker host of spark-2 stopped answering",  # the worker's twin, on a pair night
    "slow-download": "not ready",
}
SLOW_BOOT_S = 8.0  # wall seconds: more than the tiny night's whole load-stall window at --minutes 0.1 (5 s)
TINY = {"name": "tiny", "recipe": "gb10", "engines": ["vllm"], "methods": ["none", "dspark"],
        "num_speculative_tokens": [3], "concurrency": [1, 8], "requests": {1: 4, 8: 16}, "workloads": ["seed"],
        "warmup": 1, "repeats": 1, "sampling": {"max_tokens": 256, "temperature": 0}}


def _twin_servers(also: bytes = b"") -> list[int]:
    """Live stand-ins a twin started (its knobs in their environment), whatever their command line says
    (SGLang's is `python -m sglang.launch_server`, with no stand-in path in it); `also`: with that in it too."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if b"STANDIN_MODEL=" in environ and also in environ:
                found.append(int(entry.name))
    return found


def _has_twin(sweep: Path) -> bool:
    recipe = load_recipe(recipe_file(load_sweep(sweep), sweep))
    return recipe.hardware == "gb10"


@dataclass
class Night:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float


def _nights(tmp: Path) -> dict[str, tuple[str, ...]]:
    tiny = tmp / "tiny.yaml"
    tiny.write_text(yaml.safe_dump(TINY))
    nights: dict[str, tuple[str, ...]] = {s.stem: (str(s), "--minutes", "0.3") for s in SWEEPS}
    nights |= {"tune gb10": ("tune", "gb10", "--minutes", "0.15"), "up dspark": ("up", "dspark", "--minutes", "0.1"),
               "up gb10-pair": ("up", "gb10-pair", "--minutes", "0.1"),
               "0.97": ("up", "gb10:dspark", "--set", "gpu_memory_utilization=0.97")}
    nights |= {f"fault {f}": (str(tiny), "--fault", f, "--minutes", "0.1") for f in FAULTS}
    # a host lost is a night over two hosts: one machine alone is the one sparklab runs on (refused, tests/unit)
    nights["fault host-lost"] = ("up", "gb10-pair", "--fault", "host-lost", "--minutes", "0.1")
    nights["tune dead-engine"] = ("tune", "gb10", "--fault", "dead-engine", "--minutes", "0.15")
    nights["tune host-lost"] = ("tune", "gb10-pair", "--fault", "host-lost", "--minutes", "0.1")
    nights["slow boot"] = (str(tiny), "--minutes", "0.1")  # its stand-ins take SLOW_BOOT_S to print anything
    return nights


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Night]]:
    tmp = tmp_path_factory.mktemp("rehearse")
    started: dict[str, tuple[subprocess.Popen[str], float, tuple[str, ...]]] = {}
    for i, (name, args) in enumerate(_nights(tmp).items()):
        env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "SPARKLAB_API_KEY")}
        env |= {"SPARKLAB_STATE": str(tmp / f"state{i}"), "SPARKLAB_SESSION": SESSION, "COLUMNS": "250",
                "HF_HOME": str(tmp / "hf")}
        if name == "slow boot":
            env["STANDIN_BOOT_S"] = str(SLOW_BOOT_S)
        with ctrl_c_raises():
            proc = subprocess.Popen([sys.executable, "-m", "sparklab", "rehearse", *args], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)
        started[name] = (proc, time.monotonic(), args)
    done: dict[str, Night] = {}
    for name, (proc, at, args) in started.items():
        try:
            out, err = proc.communicate(timeout=max(1.0, 420 - (time.monotonic() - at)))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        done[name] = Night(args, proc.returncode, out, err, time.monotonic() - at)
    yield done
    # this session's stand-ins only (they inherit SPARKLAB_SESSION, as every engine the tier starts): another
    # worker's test may run its own beside this module
    left = sorted({*leftovers(str(STANDIN)), *_twin_servers(f"SPARKLAB_SESSION={SESSION}".encode())})
    assert not left, f"stand-in processes left behind: {left}"
    assert not list(tmp.glob("state*/processes/*.json")), "run files left behind"
    assert not list(tmp.glob("runs")), "a rehearsal wrote into ./runs"


def _clean(night: Night) -> None:
    assert "Traceback" not in night.stderr + night.stdout, night.stderr[-3000:]
    verdict = night.stdout[night.stdout.find("timeline (night clock)"):][:3000]  # what the night would lose
    assert night.returncode == 0, verdict + "\n...\n" + night.stdout[-2000:] + night.stderr[-3000:]
    assert "the real night keeps every server and every cell: 0 floor trips, 0 cells lost" in night.stdout
    assert "timeline (night clock)" in night.stdout and "the real night: downloads before the clock" in night.stdout


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.stem)
def test_every_shipped_sweep_rehearses(nights: dict[str, Night], sweep: Path) -> None:
    night = nights[sweep.stem]
    if not _has_twin(sweep):  # a CPU sweep: no twin of its hardware, said in one paragraph
        assert night.returncode == 2 and "Traceback" not in night.stderr, night.stderr
        assert "so sparklab does not know which twin to rehearse on" in night.stderr
        return
    _clean(night)
    plan_servers = night.stdout.count(" kept")
    assert plan_servers >= 2  # every server of the sweep in the timeline, each kept
    assert "sweep results" in night.stdout  # the report it would produce
    if sweep.stem == "seed000":  # sampled and not streamed: the answers' ids come whole, and are scored (before:
        # the night loaded `none` once more at its end to score 0 of its 1330 sampled answers)
        scored = re.search(r"lossless check: scored (\d+) of (\d+) sampled answers", night.stderr)
        assert scored and scored[1] == scored[2] != "0", night.stderr[-3000:]


@pytest.mark.parametrize("name", ["tune gb10", "up dspark", "up gb10-pair"])
def test_tune_up_and_the_pair_rehearse(nights: dict[str, Night], name: str) -> None:
    night = nights[name]
    _clean(night)
    if name == "up gb10-pair":  # two twin hosts, each watched, each with its floor: one server, a row per node
        timeline = night.stdout[night.stdout.index("timeline (night clock)"):].split("\n\n")[0].splitlines()[1:]
        assert [row.split()[1:4] for row in timeline] == [["spark-1:", "vllm/none", "(head)"],
                                                          ["spark-2:", "vllm/none", "(worker)"]], timeline
    if name == "tune gb10":
        assert "best per concurrency" in night.stdout
        # its space is sampled (temperature > 0): the lossless check's own start of `none`, to score the drafters'
        # answers, comes once, when the tune is done, not after every round (on a Spark each is a load of minutes;
        # before, this night made 5)
        said = night.stderr  # the night's progress lines
        assert said.count("to score the sampled answers left") == 1, said[-3000:]
        # and scores them as vLLM 0.27.1 does (/tokenize, prompt_logprobs; before, the stand-in answered 404)
        scored = re.search(r"lossless check: scored (\d+) of (\d+) sampled answers", said)
        assert scored and scored[1] == scored[2] != "0", said[-3000:]


def test_a_tune_whose_pairs_worker_host_is_lost_stops_as_an_incomplete_run_and_says_why(
        nights: dict[str, Night]) -> None:
    """The worker's Spark of a pair goes mid-night: tune's next load reaches the hosts again and leaves the lost one
    out, as a Spark that lost power does not answer; no host can take a server across two, and tune stops as an
    incomplete run naming the loss. Before, the lost twin still answered the next load's check and the night stopped
    on its first call to it ("it is gone"), where a real night would have gone on to "tune made no progress"."""
    night = nights["tune host-lost"]
    said = night.stderr + night.stdout
    assert night.returncode == 1 and "Traceback" not in said, night.stderr[-3000:]
    assert "host spark-2: left out of this run: " in said, said[-3000:]
    assert "tune cannot go on: vllm/none" in said and "the Docker host of spark-2 stopped answering" in said, said
    assert "made no progress" not in said


def test_each_load_is_its_own_row_of_the_timeline(nights: dict[str, Night]) -> None:
    """A tune loads configs again (its verdict's reloads, the lossless check's `none`), and a server lost to a dead
    engine starts again: each load is a row with its own start, ready time and verdict. Before, every row of a
    config showed its first load's: three `none` rows, all LOST at 0:00:12, though two of them were kept."""
    night = nights["tune dead-engine"]
    assert night.returncode == 1 and "Traceback" not in night.stderr + night.stdout, night.stderr[-3000:]
    timeline = night.stdout[night.stdout.index("timeline (night clock)"):].split("\n\n")[0].splitlines()[1:]
    starts = re.findall(r"server (\S+(?: K=\d+)?): starting", night.stderr)
    assert len(timeline) == len(starts), (timeline, starts)  # one row per start
    none = [row for row in timeline if re.search(r"\d  vllm/none ", row)]
    assert len(none) == starts.count("vllm/none") >= 2, timeline
    assert ["LOST: fatal" in row for row in none] == [True] + [False] * (len(none) - 1), none  # the first only
    clocks = [row.split()[0] for row in timeline]
    assert len(set(clocks)) == len(clocks) and clocks == sorted(clocks), timeline  # each its own start, in order
    ready = [f"{float(x):.0f}" for x in re.findall(r"server vllm/none: ready in ([\d.]+) s", night.stderr)]
    assert [row.split()[2] for row in none] == ready, (none, ready)  # each its own ready time


def test_a_stand_ins_slow_boot_is_not_the_nights_time(nights: dict[str, Night]) -> None:
    """A stand-in that takes SLOW_BOOT_S of wall time to print its first line (a busy machine: 13 rehearsals on
    2 cores made one take over 1 s, and seed000's load-stall window, 600 s of the night, was 1 s of wall time)
    loses nothing: its boot is no engine's modelled start, so it is outside the night's clock."""
    night = nights["slow boot"]
    _clean(night)
    assert "stalled" not in night.stdout


def _ours(tmp: Path) -> list[int]:
    """Live stand-ins whose load file is under tmp: this test's twin's, not a parallel night's."""
    return _twin_servers(f"STANDIN_LOAD_FILE={tmp}".encode())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_a_stand_in_boots_leaves_none_behind(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM or Ctrl-C while the twin waits for a stand-in's first line (its boot, up to BOOT_WAIT_S): the stand-in
    is stopped with the rehearsal, before it exits and says its servers are down. Before, the twin's launch had
    not handed the process over yet, and it ran on until its boot ended."""
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(yaml.safe_dump(TINY))
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "SPARKLAB_API_KEY")}
    env |= {"SPARKLAB_STATE": str(tmp_path / "state"), "HF_HOME": str(tmp_path / "hf"), "STANDIN_BOOT_S": "60",
            "TMPDIR": str(tmp_path)}
    with ctrl_c_raises():
        proc = subprocess.Popen([sys.executable, "-m", "sparklab", "rehearse", str(tiny), "--minutes", "0.1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not _ours(tmp_path) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert _ours(tmp_path), "no stand-in started: " + "".join(proc.communicate(timeout=30))[-3000:]
        time.sleep(0.5)  # inside its 60 s boot: the twin is waiting for its first line
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = _ours(tmp_path)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert "interrupted; the rehearsal's servers are down" in out + err
    assert not left, f"stand-ins left running after the rehearsal exited: {left}"


def test_a_097_fraction_loses_the_server(nights: dict[str, Night]) -> None:
    night = nights["0.97"]
    assert night.returncode == 1 and "Traceback" not in night.stderr
    assert "LOST: preflight" in night.stdout and "--gpu-memory-utilization 0.97" in night.stdout


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_is_a_night_that_loses_something(nights: dict[str, Night], fault: str) -> None:
    night = nights[f"fault {fault}"]
    assert "Traceback" not in night.stderr + night.stdout, night.stderr[-3000:]
    assert night.returncode == 1, night.stdout[-3000:]
    assert "the real night would lose" in night.stdout
    assert FAULTS[fault] in night.stdout, night.stdout[-3000:]
    if fault == "host-lost":  # the worker's host went, not the head's; a loss, not a kill by the OOM killer
        said = night.stderr + night.stdout  # the night's progress lines, then the verdict
        assert "[spark-1] lost" not in said and "out of memory" not in said, said[-3000:]
        assert "host spark-2 lost: server vllm/none goes back to the queue" in said, said[-3000:]
