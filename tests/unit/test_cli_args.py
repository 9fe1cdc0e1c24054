"""Each command's typed arguments: a parse of the real parser → the request its library call takes, defaults
included, and no flag left unread."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from sparklab.bench.cell import Load
from sparklab.cli.bench import BenchArgs
from sparklab.cli.check import CheckArgs
from sparklab.cli.compare import CompareArgs
from sparklab.cli.hosts import DownArgs, GcArgs, LogsArgs, PsArgs
from sparklab.cli.main import COMMANDS, build_parser
from sparklab.cli.pull import PullArgs
from sparklab.cli.recipes import RecipesArgs
from sparklab.cli.report import ReportArgs
from sparklab.cli.sweep import SweepArgs, TuneArgs
from sparklab.cli.up import RenderArgs, UpArgs, launch_options
from sparklab.recipes.render import LaunchOptions
from sparklab.records import Sampling
from sparklab.sweep.runner import Options, Request
from sparklab.tune.driver import TuneChoices
from tests.clikit import EVERY_FLAG, namespace_reads

HF_DEFAULT = Path("~/.cache/huggingface").expanduser()


@pytest.fixture(autouse=True)
def no_hf_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HOME", raising=False)  # --hf-cache's default comes from it


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_flag_reaches_the_typed_arguments(command: str) -> None:
    """A flag added to a command's add_cli_args but not read back in its from_cli_args would be silently ignored."""
    namespace = parse(*EVERY_FLAG[command])
    with namespace_reads() as reads:
        COMMANDS[command].args.from_cli_args(namespace)
    flags = set(vars(namespace)) - {"command", "debug"}  # main's own
    assert flags - {name for _, name in reads} == set()


def test_every_command_has_a_line_that_sets_every_flag() -> None:
    assert set(EVERY_FLAG) == set(COMMANDS)


# -- render and up --------------------------------------------------------------------------------------------

LAUNCH_DEFAULTS = dict(target=None, engine=None, overrides=[], hosts=(), image=None, port=None,
                       num_speculative_tokens=None, extra_args=(), env=(), hf_cache=HF_DEFAULT, ulimits=(), gpus=None,
                       public=False, api_key=True, ready_timeout=None)


def test_render_defaults() -> None:
    assert RenderArgs.from_cli_args(parse("render", "dspark")) == RenderArgs(
        spec="dspark", **LAUNCH_DEFAULTS, host_checks=False)  # type: ignore[arg-type]


def test_render_with_every_flag() -> None:
    assert RenderArgs.from_cli_args(parse(*EVERY_FLAG["render"])) == RenderArgs(
        spec="gb10:dspark", target="gb10", engine="sglang", overrides=["a=1", "b=2"], hosts=("local",),
        image="my/img:1", port=9000, num_speculative_tokens=3, extra_args=("--x",), env=("A=1",),
        hf_cache=Path("/tmp/hf"), ulimits=("memlock=-1",), gpus=False, public=True, api_key=False,
        ready_timeout=30.0, host_checks=True)


def test_up_defaults() -> None:
    assert UpArgs.from_cli_args(parse("up", "cpu:none")) == UpArgs(
        spec="cpu:none", **LAUNCH_DEFAULTS, detach=False, pull="missing",  # type: ignore[arg-type]
        api_key_value=None, allow_foreign_platform=False, dry_run=False, download=True, stall_timeout=None,
        memory_floor_gib=None)


def test_up_with_every_flag() -> None:
    assert UpArgs.from_cli_args(parse(*EVERY_FLAG["up"])) == UpArgs(
        spec="dspark", target="gb10", engine="vllm", overrides=["a=1"], hosts=("ssh://a", "ssh://b"), image="i",
        port=9001, num_speculative_tokens=2, extra_args=("--y",), env=("B",), hf_cache=Path("/tmp/hf2"),
        ulimits=("stack=1",), gpus=False, public=True, api_key=False, ready_timeout=60.0, detach=True,
        pull="always", api_key_value="k-1", allow_foreign_platform=True, dry_run=True, download=False,
        stall_timeout=5.0, memory_floor_gib=3.0)


def test_the_launch_flags_become_renders_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # --hf-cache ~/hf is expanded against it
    args = RenderArgs.from_cli_args(parse("render", "dspark", "--image", "i", "--port", "9000", "-k", "4",
                                          "--serve-arg=--x", "-e", "A=1", "--hf-cache", "~/hf", "--ulimit", "a=1",
                                          "--no-gpus", "--public", "--no-api-key", "--ready-timeout", "30"))
    expected = LaunchOptions(image="i", port=9000, num_speculative_tokens=4, public=True, api_key=False,
                             hf_cache=tmp_path / "hf", gpus=False, extra_args=("--x",), env=("A=1",),
                             ulimits=("a=1",), run_id="", mode="render", ready_timeout_s=30.0)
    assert launch_options(args, mode="render") == expected
    up = launch_options(args)  # each server `up` starts gets a run id of its own
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", up.run_id)
    assert up == LaunchOptions(**{**vars(expected), "run_id": up.run_id, "mode": "up"})


# -- bench ----------------------------------------------------------------------------------------------------


def test_bench_defaults() -> None:
    assert BenchArgs.from_cli_args(parse("bench")) == BenchArgs(
        url=None, container=None, api_key=None, model=None, workload="seed",
        load=Load(concurrency=1, requests=10, duration_s=None, rate=None, warmup=2, stream=True),
        sampling=Sampling(), request_timeout=1800, stall_timeout=60.0, json_path=None)


def test_bench_with_every_flag() -> None:
    assert BenchArgs.from_cli_args(parse(*EVERY_FLAG["bench"])) == BenchArgs(
        url="http://127.0.0.1:9/v1", container=None, api_key="k", model="m", workload="w.jsonl",
        load=Load(concurrency=4, requests=None, duration_s=3.0, rate=2.0, warmup=0, stream=False),
        sampling=Sampling(max_tokens=5, temperature=0.0, top_p=0.5, ignore_eos=True, min_tokens=2,
                          enable_thinking=True, seed=7, token_ids=False),
        request_timeout=9.0, stall_timeout=8.0, json_path=Path("o.json"))


@pytest.mark.parametrize(("flags", "requests", "thinking"), [
    (["--container", "c", "-n", "3"], 3, False), (["--thinking", "default"], 10, None)])
def test_bench_request_count_and_thinking(flags: list[str], requests: int, thinking: bool | None) -> None:
    args = BenchArgs.from_cli_args(parse("bench", *flags))
    assert args.load.requests == requests and args.sampling.enable_thinking is thinking


# -- sweep and tune -------------------------------------------------------------------------------------------


def test_sweep_defaults_are_the_requests() -> None:
    assert SweepArgs.from_cli_args(parse("sweep", "s.yaml")) == SweepArgs(Request(Path("s.yaml")), dry_run=False)


def test_sweep_with_every_flag() -> None:
    assert SweepArgs.from_cli_args(parse(*EVERY_FLAG["sweep"])) == SweepArgs(
        Request(Path("s.yaml"), runs_dir=Path("rd"), resume="r1", new=True, retry_failed=True, ulimits=("a=1",),
                options=Options(pull_policy="never", drop_caches=False, min_free_mib=5.0, memory_floor_gib=2.5,
                                allow_drift=True),
                download=False, hosts=("local", "ssh://x")),
        dry_run=True)


def test_tune_defaults_are_the_choices() -> None:
    assert TuneArgs.from_cli_args(parse("tune", "cpu-demo")) == TuneArgs(TuneChoices("cpu-demo"), dry_run=False)


def test_tune_with_every_flag() -> None:
    assert TuneArgs.from_cli_args(parse(*EVERY_FLAG["tune"])) == TuneArgs(
        TuneChoices("cpu", methods=("none", "ngram"), k=(1, 2, 3), concurrency=(1, 4), workload="seed",
                    objective="decode", ttft_max_ms=500.0, repeats=3, max_repeats=4, requests=6, max_tokens=9,
                    tolerance=0.2, runs_dir=Path("rd"), resume="r2", new=True, pull_policy="always",
                    ulimits=("a=1",), download=False),
        dry_run=True)


# -- report, pull, the host commands, recipes ----------------------------------------------------------------


def test_report_defaults_and_every_flag() -> None:
    assert ReportArgs.from_cli_args(parse("report", "r3")) == ReportArgs(
        run="r3", runs_dir=Path("runs"), format="md", out=None, hardware=None, bandwidth_gbps=None, facts=[])
    assert ReportArgs.from_cli_args(parse(*EVERY_FLAG["report"])) == ReportArgs(
        run="r3", runs_dir=Path("rd"), format="html", out=Path("out"), hardware="gb10", bandwidth_gbps=273.0,
        facts=["a=1", "b=2"])


def test_compare_defaults_and_every_flag() -> None:
    assert CompareArgs.from_cli_args(parse("compare", "r1", "r2")) == CompareArgs(
        runs=["r1", "r2"], runs_dir=Path("runs"), format="md", out=None, force=False)
    assert CompareArgs.from_cli_args(parse(*EVERY_FLAG["compare"])) == CompareArgs(
        runs=["r1", "r2"], runs_dir=Path("rd"), format="csv", out=Path("out"), force=True)


def test_pull_defaults_and_every_flag() -> None:
    assert PullArgs.from_cli_args(parse("pull", "dspark")) == PullArgs(
        spec="dspark", target=None, engine=None, overrides=[], all_methods=False, hf_cache=HF_DEFAULT,
        pull="missing", images=True, models=True)
    assert PullArgs.from_cli_args(parse(*EVERY_FLAG["pull"])) == PullArgs(
        spec="gb10", target="gb10", engine="vllm", overrides=["a=1"], all_methods=True, hf_cache=Path("/tmp/h"),
        pull="always", images=False, models=False)


def test_check_defaults_and_every_flag() -> None:
    assert CheckArgs.from_cli_args(parse("check", "cpu-demo")) == CheckArgs(
        spec="cpu-demo", target=None, engine=None, overrides=[], pull="missing", cache=True, timeout_s=180.0)
    assert CheckArgs.from_cli_args(parse(*EVERY_FLAG["check"])) == CheckArgs(
        spec="cpu", target="gb10", engine="vllm-cpu", overrides=["a=1"], pull="never", cache=False, timeout_s=30.0)


def test_the_hf_cache_default_follows_hf_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert PullArgs.from_cli_args(parse("pull", "dspark")).hf_cache == tmp_path / "hf"
    assert UpArgs.from_cli_args(parse("up", "dspark")).hf_cache == tmp_path / "hf"


def test_the_host_commands_defaults_and_every_flag() -> None:
    assert PsArgs.from_cli_args(parse("ps")) == PsArgs(hosts=())
    assert PsArgs.from_cli_args(parse(*EVERY_FLAG["ps"])) == PsArgs(hosts=("local", "ssh://x"))
    assert DownArgs.from_cli_args(parse("down")) == DownArgs(name=None, all=False, all_users=False, hosts=())
    assert DownArgs.from_cli_args(parse(*EVERY_FLAG["down"])) == DownArgs("n1", all=True, all_users=True,
                                                                          hosts=("local",))
    assert LogsArgs.from_cli_args(parse("logs")) == LogsArgs(name=None, follow=False, tail="all", hosts=())
    assert LogsArgs.from_cli_args(parse(*EVERY_FLAG["logs"])) == LogsArgs("n2", follow=True, tail="10",
                                                                          hosts=("local",))
    assert GcArgs.from_cli_args(parse("gc")) == GcArgs(caches=False, keep=None, max_gib=None, hosts=())
    assert GcArgs.from_cli_args(parse(*EVERY_FLAG["gc"])) == GcArgs(caches=True, keep=2, max_gib=3.0,
                                                                    hosts=("local",))


def test_recipes_takes_no_flags() -> None:
    assert RecipesArgs.from_cli_args(parse("recipes")) == RecipesArgs()
