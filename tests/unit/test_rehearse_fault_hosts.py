"""Where `rehearse --fault` lands on a night over several twin hosts, and the one night a host loss cannot be.

One fault per night, on one twin: the engine's faults (dead-engine, oom) on the first host's first server (on a pair
night, the head), a host loss on the night's last host (on a pair night, the worker's Spark, so the head's host is
the one that goes on). Before, every twin armed the fault on its own first server: a pair night lost both hosts, and
the verdict blamed the OOM killer for the stand-ins the loss killed (exit code 137).

A host lost on a night that runs on one machine is the machine sparklab itself runs on: no sweep goes on without
it (the run resumes once it is back), so the rehearsal refuses it in one paragraph, naming the night to run instead.
The nights themselves run in tests/process/test_rehearse.py."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import pytest
import yaml

from sparklab.cli.main import main
from sparklab.rehearse import night
from sparklab.runtimes.twin import FAULTS


def _prepare(tmp_path: Path, what: str, command: str, fault: str) -> dict[str, str | None]:
    with contextlib.ExitStack() as claims:
        (tmp_path / "scratch").mkdir(exist_ok=True)
        _, runtimes = night.prepare(night.RehearsalRequest(what, command, fault), tmp_path / "scratch", claims)
    return {name: runtime.fault for name, runtime in runtimes.items()}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_pair_nights_fault_lands_on_one_twin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the port claims: this test's
    faults = _prepare(tmp_path, "gb10-pair", "up", fault)
    where = "spark-2" if fault == "host-lost" else "spark-1"
    engine_fault = fault in ("dead-engine", "oom", "host-lost")
    assert faults == {"spark-1": fault if engine_fault and where == "spark-1" else None,
                      "spark-2": fault if engine_fault and where == "spark-2" else None}


def test_a_host_lost_on_a_night_on_one_machine_is_refused_in_one_paragraph(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("SPARKLAB_STATE", str(tmp_path / "state"))
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text(yaml.safe_dump({"name": "tiny", "recipe": "gb10", "methods": ["none"], "concurrency": [1],
                                     "requests": 1}))
    with pytest.raises(night.RecipeError) as raised:
        _prepare(tmp_path, str(sweep), "sweep", "host-lost")
    assert "--fault host-lost" in raised.value.message and "gb10-pair" in raised.value.hint
    code = main(["rehearse", str(sweep), "--fault", "host-lost"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert "one machine" in err and "sparklab rehearse up gb10-pair --fault host-lost" in err, err
    assert not list(tmp_path.glob("sparklab-rehearse-*")), "the refused night left its scratch directory"


def test_a_lost_twin_is_left_out_when_a_run_reaches_its_hosts_as_a_dead_docker_host_is(tmp_path: Path) -> None:
    """A later run of the night (tune's next load, a resumed sweep) reaches its hosts again: a real Spark that lost
    power does not answer and is left out with one line. Before, the lost twin answered with its facts, and the run
    then stopped on its first call to it (\"the night stopped: ... it is gone\"), which no real night does."""
    from sparklab.host.twin import TwinHost
    from sparklab.recipes.hosts import Host
    from sparklab.recipes.twin import load_twin
    from sparklab.runtimes.twin import TwinRuntime, TwinSetup
    from sparklab.sweep import fleet

    setup = TwinSetup("fault-hosts", tmp_path / "twin")
    twins = {name: TwinRuntime(TwinHost(load_twin("gb10"), 0.01, name), setup, name) for name in ("spark-1", "spark-2")}
    twins["spark-2"].lost.set()
    said: list[str] = []
    hosts = [Host(name=name, docker=f"ssh://twin@{name}", address=name) for name in twins]
    members = fleet.connect(hosts, said.append, reach=lambda host: twins[host.name])
    assert [m.name for m in members] == ["spark-1"]
    assert any(line.startswith("host spark-2: left out of this run: ") and "gone" in line for line in said), said
