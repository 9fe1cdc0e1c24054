"""`sparklab tune` on what a user gives it: every shipped sweep file (by name and by path) and every recipe x
engine x method, as `--dry-run`; and what tune does with each setting a sweep file can hold (issue 23)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.cli.main import build_parser, main
from sparklab.cli.sweep import TuneArgs
from sparklab.recipes.plan import build_plan
from sparklab.recipes.schema import list_recipes, load_recipe, recipes_dir
from sparklab.recipes.sweep_file import load_sweep
from sparklab.runtimes import containers
from sparklab.tune import driver
from tests.fakes import FakeRuntime

SWEEPS = sorted((recipes_dir() / "sweeps").glob("*.yaml"))


@pytest.fixture(autouse=True)
def no_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a dry run touched Docker")

    monkeypatch.setattr(containers.Docker, "__init__", refuse)


def _plan_lines(out: str) -> dict[str, Any]:
    """The figures a sane tune plan prints: repeats, loads, the ETA bound and the first round's configs."""
    head = re.search(r"maximise (\S+) tok/s.*?; (\d+) repeat\(s\) per measured config, up to (\d+)", out)
    loads = re.search(r"at most (\d+) model loads \(each of the (\d+) configs once", out)
    eta = re.search(r"ETA at most (\d+) h (\d+) min", out)
    assert head and loads and eta, out
    return {"objective": head[1], "repeats": int(head[2]), "max_repeats": int(head[3]), "loads": int(loads[1]),
            "configs": int(loads[2]), "eta_min": int(eta[1]) * 60 + int(eta[2]),
            "probe": re.findall(r"^  (\S+(?: K=\d+)?): ", out.split("next round:")[1], re.MULTILINE)}


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
@pytest.mark.parametrize("how", ["name", "path"])
def test_tune_dry_run_plans_every_shipped_sweep_file(path: Path, how: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tune", path.stem if how == "name" else str(path), "--dry-run", "--runs-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.out + captured.err
    plan = _plan_lines(captured.out)
    sweep = load_sweep(path)
    if sweep.repeats == "auto":  # at least auto_repeats.min runs per measured config, at most auto_repeats.max
        assert (plan["repeats"], plan["max_repeats"]) == (sweep.auto_repeats.min, sweep.auto_repeats.max)
    else:  # the file's repeats, or tune's own default of 2 when it gives none; up to twice that
        given = yaml.safe_load(path.read_text()).get("repeats", 2)
        assert plan["repeats"] == given and plan["max_repeats"] == 2 * given
    assert plan["objective"] == ("decode" if sweep.headline == "decode" else "aggregate")
    assert plan["probe"] and all(label.split()[0] in sweep.methods for label in plan["probe"])
    assert plan["configs"] >= len(plan["probe"]) and plan["loads"] >= plan["configs"] and plan["eta_min"] > 0
    assert not tmp_path.joinpath("runs").exists() and not any(tmp_path.iterdir())  # nothing written


def _recipe_engine_methods() -> list[tuple[str, str, str]]:
    out = []
    for path in list_recipes():
        recipe = load_recipe(path)
        out += [(path.stem, name, method) for name, entry in recipe.engines.items() for method in entry.methods]
    return out


@pytest.mark.parametrize(("recipe", "engine", "method"), _recipe_engine_methods(),
                         ids=["/".join(x) for x in _recipe_engine_methods()])
def test_tune_dry_run_plans_every_recipe_engine_and_method(recipe: str, engine: str, method: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    nodes = load_recipe(recipes_dir() / f"{recipe}.yaml").engines[engine].nodes
    argv = ["tune", recipe, "--engine", engine, "--methods", method, "--concurrency", "1", "--k", "1-3",
            "--dry-run", "--runs-dir", str(tmp_path)]
    code = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    if nodes > 1:  # a server across hosts: said before anything else, and with the hosts it plans
        assert code != 0 and f"needs {nodes} Docker hosts, 0 given" in captured.err, captured.err
        hosts = [f"ssh://me@spark-{i},cluster_address=192.168.100.1{i},interface=enp1s0f1np1,ib_hca=rocep1s0f1"
                 for i in range(nodes)]
        code = main([*argv, *(x for h in hosts for x in ("--host", h))])
        captured = capsys.readouterr()
        assert "spark-1" in captured.out
    assert code == 0, captured.err
    plan = _plan_lines(captured.out)
    assert plan["probe"][0].split()[0] == method and plan["eta_min"] > 0


def _space_file(tmp_path: Path, **changes: Any) -> Path:
    doc = {"name": "everything", "recipe": "cpu", "engines": ["vllm-cpu"], "methods": ["none", "ngram"],
           "num_speculative_tokens": [1, 2], "concurrency": [1, 4], "workloads": ["seed", "speedbench-1k"],
           "repeats": "auto", "auto_repeats": {"min": 2, "max": 6, "target": 0.05}, "headline": "decode",
           "requests": {1: 3, 4: 8}, "warmup": 1, "stream": True,
           "sampling": {"max_tokens": 48, "temperature": 0, "top_p": None, "ignore_eos": True},
           "set": ["max_model_len=1024"], "exclude": [{"method": "ngram", "num_speculative_tokens": 2,
                                                       "concurrency": 4}],
           "overrides": [{"match": {"method": "ngram"}, "serve_args": ["--seed=7"]}], "max_attempts": 2,
           "require_ok": 0.9, "request_timeout_s": 120, "stall_timeout_s": 30, "memory_floor_gib": 1.5,
           "load_stall_s": 90, "hosts": ["local"], **changes}
    path = tmp_path / "everything.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _request(*argv: str) -> driver.TuneRequest:
    return driver.request_for(TuneArgs.from_cli_args(build_parser().parse_args(["tune", *argv])).choices)


def test_tune_reads_every_setting_of_a_sweep_file(tmp_path: Path) -> None:
    request = _request(str(_space_file(tmp_path)))
    # repeats: auto -> at least auto_repeats.min per measured config, up to auto_repeats.max where it matters
    assert (request.settings.repeats, request.settings.max_repeats) == (2, 6)
    assert request.objective == "decode"  # headline: decode -> the search maximises decode tok/s
    assert request.space["workloads"] == ["seed"]  # one workload at a time: the first, said in the notes
    assert any("speedbench-1k" in note and "--workload" in note for note in request.notes)
    assert any("auto_repeats.target" in note for note in request.notes)  # what tune does not use, said
    (tmp_path / "run").mkdir()
    written = driver.write_space(tmp_path / "run", request.space, request.settings)
    plan = build_plan(written)
    sweep = plan.sweep
    assert sweep.repeats == 6 and sweep.memory_floor_gib == 1.5 and sweep.max_attempts == 2
    assert (sweep.require_ok, sweep.request_timeout_s, sweep.stall_timeout_s, sweep.load_stall_s) == (0.9, 120, 30, 90)
    assert (sweep.warmup, sweep.sampling.max_tokens, sweep.sampling.ignore_eos) == (1, 48, True)
    assert [h.docker for h in sweep.hosts] == ["local"]
    ngram = [s for s in plan.servers if s.method == "ngram"]
    assert all(s.serve_args == ("--seed=7",) for s in ngram)  # overrides reach the servers
    assert all("1024" in s.spec.argv for s in plan.servers)  # set: reaches the recipe
    k2 = next(s for s in ngram if s.num_speculative_tokens == 2)
    assert {c.concurrency for c in k2.cells} == {1}  # exclude: drops its cells
    assert {c.requests for s in plan.servers for c in s.cells} == {3, 8}


def test_a_sampling_axis_is_searched_at_its_first_value_and_said(tmp_path: Path) -> None:
    """A quality sweep lists temperatures (and budgets) as load axes; tune picks a method and K for one sampling:
    the first of each list, said in the notes (as for workloads); --max-tokens wins over the list."""
    path = _space_file(tmp_path, sampling={"temperature": [0, 1.0], "top_p": 0.95, "max_tokens": [32, 64]})
    request = _request(str(path))
    assert (request.space["sampling"]["temperature"], request.space["sampling"]["max_tokens"]) == (0, 32)
    assert any("sampling.temperature lists 2 values" in note and "tune searches at 0" in note
               for note in request.notes), request.notes
    assert any("sampling.max_tokens lists 2 values" in note and "--max-tokens" in note for note in request.notes)
    request = _request(str(path), "--max-tokens", "64")
    assert request.space["sampling"]["max_tokens"] == 64
    assert not any("max_tokens" in note for note in request.notes)
    (tmp_path / "run").mkdir()
    sweep = build_plan(driver.write_space(tmp_path / "run", request.space, request.settings)).sweep
    assert (sweep.sampling.temperature, sweep.sampling.max_tokens) == (0, 64)


def test_flags_win_over_the_sweep_file(tmp_path: Path) -> None:
    path = str(_space_file(tmp_path))
    request = _request(path, "--objective", "aggregate", "--repeats", "3", "-w", "speedbench-1k")
    assert request.objective == "aggregate" and request.space["workloads"] == ["speedbench-1k"]
    assert (request.settings.repeats, request.settings.max_repeats) == (3, 6)  # auto's max stays the bound
    request = _request(path, "--repeats", "4", "--max-repeats", "4")
    assert (request.settings.repeats, request.settings.max_repeats) == (4, 4)
    plain = _request(str(_space_file(tmp_path, repeats=2, headline="seed000")))
    assert (plain.settings.repeats, plain.settings.max_repeats, plain.objective) == (2, 4, "aggregate")


def test_the_dry_run_says_what_it_took_from_the_sweep_file(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", str(_space_file(tmp_path)), "--dry-run", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "note: the sweep file names 2 workloads; tune searches seed" in out
    assert "hosts: local" in out


def test_a_sweep_files_hosts_reach_the_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparklab.sweep import runner

    seen: dict[str, Any] = {}

    def fake_run(plan: Any, store: Any, docker: Any, run_dir: Any, options: Any, say: Any,
                 hosts: Any = None, **reach: Any) -> dict[str, int]:
        seen["hosts"] = hosts
        raise KeyboardInterrupt  # stop after the first round; the tune is left resumable

    monkeypatch.setattr(runner, "run", fake_run)
    request = _request(str(_space_file(tmp_path, hosts=["local", "ssh://me@spark-2"])), "--runs-dir",
                       str(tmp_path / "runs"), "--no-download")
    outcome = driver.run_tune(request, say=lambda message: None, runtime=FakeRuntime())
    assert outcome.interrupted
    assert [h.docker for h in seen["hosts"]] == ["local", "ssh://me@spark-2"]
