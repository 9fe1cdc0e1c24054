"""Rehearsals started together on one machine (CI starts a dozen) never share a server port: each claims its ports
with a lock file before its servers bind them, so a bind check that two nights pass at once cannot hand both the
same port (seen in CI: every cell of one night got a 401 from another night's server)."""

from __future__ import annotations

import contextlib
import random
import tempfile
from pathlib import Path

import pytest
import yaml

from sparklab.errors import ServerError
from sparklab.host.twin import TwinHost
from sparklab.recipes.plan import build_plan
from sparklab.recipes.twin import load_twin
from sparklab.rehearse import night
from sparklab.runtimes.twin import TwinRuntime, TwinSetup


@pytest.fixture
def same_draws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every rehearsal draws the same offsets in the same order, and claims ports under this test's temp dir."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seeded = random.Random
    monkeypatch.setattr(night.random, "Random", lambda: seeded(7))
    monkeypatch.setattr(night, "port_in_use", lambda host, port: False)  # both nights check before either binds
    monkeypatch.setattr(night, "_ephemeral_range", lambda: range(32768, 61000))  # Linux's default


def test_two_rehearsals_that_draw_the_same_offset_get_different_ports(same_draws: None) -> None:
    with contextlib.ExitStack() as first, contextlib.ExitStack() as second:
        a = night._free_offset([8000, 30000], 2, first)
        b = night._free_offset([8000, 30000], 2, second)
        ports_a = {p + a + 100 * h for p in (8000, 30000) for h in range(2)}
        ports_b = {p + b + 100 * h for p in (8000, 30000) for h in range(2)}
        assert not ports_a & ports_b


def test_a_finished_rehearsal_releases_its_ports(same_draws: None) -> None:
    with contextlib.ExitStack() as first:
        a = night._free_offset([8000], 1, first)
    with contextlib.ExitStack() as second:
        assert night._free_offset([8000], 1, second) == a


@pytest.mark.parametrize("ports", [[8000, 30000], [8080, 30000, 64000], [20000]])
def test_no_port_past_65535_nor_among_the_kernels_outgoing_ports(same_draws: None, ports: list[int]) -> None:
    """Seen in CI: SGLang's 30000 moved into 32768-60999, where a client's socket took it before the server."""
    for _ in range(20):
        with contextlib.ExitStack() as claims:
            offset = night._free_offset(ports, 2, claims)
            for port in (p + offset + 100 * h for p in ports for h in range(2)):
                assert port <= 65535 and not 32768 <= port <= 60999, (ports, offset)


def test_no_usable_offset_is_one_paragraph(same_draws: None) -> None:
    with contextlib.ExitStack() as claims, pytest.raises(night.SparklabError, match="no free port range"):
        night._free_offset([40000, 20000], 1, claims)  # 40000 leaves the outgoing range only where 20000 enters it


def test_a_cluster_rendezvous_port_is_claimed_too(same_draws: None) -> None:
    """A pair rehearsal's head binds its rendezvous (Ray's GCS, 6379 in gb10-pair) on this machine: two at once got
    the same one."""
    with contextlib.ExitStack() as first, contextlib.ExitStack() as second:
        ports = {night._free_port(first) for _ in range(3)} | {night._free_port(second) for _ in range(3)}
        assert len(ports) == 6 and not any(32768 <= p <= 60999 for p in ports)


def test_no_night_keeps_the_recipes_own_ports(same_draws: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offset 0 is never drawn: a night on the recipe's own ports could not tell its servers from one rendered
    without the twin's port_offset (another night's, or its own by mistake), so the twin's check below would pass."""
    monkeypatch.setattr(night.random, "Random", lambda: type("Unshuffled", (), {"shuffle": lambda self, x: None})())
    with contextlib.ExitStack() as claims:
        assert night._free_offset([8000], 1, claims) != 0


def test_a_twin_refuses_a_server_on_a_port_its_rehearsal_did_not_claim(tmp_path: Path) -> None:
    """A server rendered without its host's port_offset lands on the recipe's port, which another rehearsal may
    hold: seen in CI, the two nights' servers answered each other's requests with a 401. The twin starts nothing
    there and says why, so the night names the bug instead of reaching a stranger."""
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text(yaml.safe_dump({"name": "tiny", "recipe": "gb10", "methods": ["none"], "concurrency": [1],
                                     "requests": 1}))
    spec = build_plan(sweep, run_id="r1").servers[0].spec
    setup = TwinSetup("tiny", tmp_path / "twin", ports=frozenset({spec.port + 7}))
    runtime = TwinRuntime(TwinHost(load_twin("gb10"), 0.01, ""), setup)
    with pytest.raises(ServerError, match=f"port {spec.port} is not one this rehearsal claimed"):
        runtime.launch(spec, {})
    assert not (tmp_path / "twin").exists()  # nothing was started


@pytest.mark.parametrize("setting", ["methods", "set", "--set"])
def test_a_bad_sweep_file_is_named_as_the_user_gave_it_not_as_the_rehearsals_scratch_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    """The rehearsal runs a copy of the sweep file (its hosts moved to the twins) in a scratch directory that is gone
    when the error is read: the error names the file the user gave and its key, with the fix; a bad `--set` of the
    command line is named as the command's, not the file's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    sweep = tmp_path / "mine.yaml"
    document = {"name": "mine", "recipe": str(Path(night.__file__).parents[2] / "recipes" / "gb10.yaml"),
                "methods": ["none"], "concurrency": [1], "requests": 1}
    document |= {"methods": {"methods": ["none", "nosuch"]}, "set": {"set": ["no_such_key=1"]}, "--set": {}}[setting]
    sweep.write_text(yaml.safe_dump(document))
    request = night.RehearsalRequest(str(sweep), overrides=("no_such_key=1",) if setting == "--set" else ())
    with contextlib.ExitStack() as claims, pytest.raises(night.RecipeError) as raised:
        (tmp_path / "scratch").mkdir()
        night.prepare(request, tmp_path / "scratch", claims)
    message = raised.value.message
    assert "scratch" not in message and "plan.yaml" not in message, message
    assert ("nosuch" if setting == "methods" else "no_such_key") in message + raised.value.hint
    if setting == "--set":
        assert message.startswith(f"rehearse {sweep} --set no_such_key=1: "), message
    else:
        assert message.startswith(f"{sweep}: "), message
