"""Every host a server runs on is watched (issue 23): before the start, its memory comes back and the page cache of
the model's files is dropped where MemFree is short; the floor under MemAvailable is set from the room the recipe's
memory fraction leaves there; and while the server starts and serves, a sampler reads the host's facts and stops
the server at the floor. This machine, another Docker host (through a helper container, runtimes/hostwatch.py)
and a rehearsal's twin are read through one interface (host/facts.py), so each of them gets the same policy.

A server across hosts (a pair) has one watched host per node: each node's host has its own baseline, page cache and
floor, and any of them reaching its floor stops the whole server.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from sparklab.host import pagecache, watchdog
from sparklab.host.facts import HostFacts
from sparklab.host.headroom import headroom
from sparklab.host.memory import unified_need
from sparklab.recipes.plan import ServerConfig
from sparklab.runtimes.base import HostRuntime

Say = Callable[[str], None]


@dataclass
class Watched:
    """One host of a server: its name, its facts, its baseline and floor, and (once the server starts) its sampler."""

    name: str
    facts: HostFacts
    baseline_gib: float
    floor_gib: float | None
    sampler: watchdog.Sampler | None = None

    @property
    def tripped(self) -> bool:
        return self.sampler is not None and self.sampler.tripped is not None


def prepare(server: ServerConfig, name: str, facts: HostFacts, baseline_gib: float, *, configured: float | None,
            drop_caches: bool | None, memory_wait_s: float, time_scale: float, say: Say,
            label: str | None = None) -> Watched:
    """Before the start on one host: memory back, the model's page cache dropped if MemFree is short, the floor.
    label: how lines name the host (None: this machine alone, named by nothing)."""
    on = f" on {label}" if label else ""
    wait_memory(facts, baseline_gib, memory_wait_s, say, server, on, time_scale)
    if drop_caches is not False:
        pagecache.free_page_cache(server.recipe, server.spec, say, facts, every_recipe=bool(drop_caches))
    room = headroom(server.spec, server.recipe, facts.meminfo(), available_at_start=baseline_gib)
    floor = watchdog.floor_for(server.recipe, configured, room)
    if room is not None and floor:  # not "server X: ...", the prefix of a server's start, ready and failure lines
        say(f"memory floor for {server.label}{on}: {floor:.2f} GiB ({room.explain()})"
            + ("" if configured is None or room.room_gib >= floor else
               "; the configured floor is above that, so the watchdog will likely stop this server"))
    return Watched(label or name, facts, baseline_gib, floor)


def wait_memory(facts: HostFacts, baseline_gib: float, timeout_s: float, say: Say, server: ServerConfig | None = None,
                on: str = "", time_scale: float = 1.0) -> None:
    """GB10 memory is unified: wait until what the previous server held is available again, or, judged as
    the next engine will, until MemFree covers its share."""
    deadline = time.monotonic() + timeout_s
    while True:
        host = facts.meminfo()
        available = host.available_gib
        need = unified_need(server.spec, server.recipe, host) if server is not None else None
        if need is not None and host.free_gib >= need.gib:
            return
        if available >= baseline_gib - 1.0 or time.monotonic() > deadline:
            if available < baseline_gib - 1.0:
                say(f"memory{on}: {available:.1f} GiB available, {baseline_gib:.1f} GiB before the last server; "
                    f"going on after {timeout_s / time_scale:.0f} s")
            return
        time.sleep(1.0 * time_scale)


def samplers(hosts: list[Watched], interval_s: float, stop: Callable[[], None],
             locate: Callable[[], str | None]) -> list[watchdog.Sampler]:
    """One sampler per host (the first is the server's own host, whose container's cgroup it also reads); any of
    them at its floor stops the server."""
    for i, host in enumerate(hosts):
        host.sampler = watchdog.Sampler(interval_s=interval_s, floor_gib=host.floor_gib, on_floor=stop,
                                        locate=locate if i == 0 else None, facts=host.facts)
    return [h.sampler for h in hosts if h.sampler is not None]


def tripped(hosts: list[Watched]) -> Watched | None:
    return next((h for h in hosts if h.tripped), None)


def watch_hosts(server: ServerConfig, hosts: list[tuple[str, HostRuntime]], baselines: dict[str, float],
                readers: list[HostFacts], *, configured: float | None, drop_caches: bool | None, memory_wait_s: float,
                time_scale: float, say: Say) -> list[Watched]:
    """Every host the server runs on (its own first), prepared and with its floor; a host whose facts cannot be
    read runs unwatched, and the sweep says so. baselines: MemAvailable per host before its first server (a host
    not in it is measured now, and kept); readers: every facts opened, for the caller to close."""
    watched = []
    for i, (name, runtime) in enumerate(hosts):
        label = None if i == 0 else name  # the server's own host: its lines already say where
        facts = runtime.host_facts(server.spec)
        if facts is None:
            if server.recipe.unified_memory:
                say(f"memory on {name}: not watched (its memory cannot be read from here)")
            continue
        readers.append(facts)
        baseline = baselines.get(name)
        if baseline is None:  # its first server: what the host holds without one
            baseline = baselines.setdefault(name, facts.meminfo().available_gib)
        watched.append(prepare(server, name, facts, baseline, configured=configured, drop_caches=drop_caches,
                               memory_wait_s=memory_wait_s * time_scale, time_scale=time_scale, say=say,
                               label=label))
    return watched


def kill_nodes(server: ServerConfig, runtimes: list[HostRuntime]) -> None:
    """A server across hosts at a floor: every node now (the head's host, then the others)."""
    for runtime, node in zip(runtimes, server.cluster.nodes if server.cluster else (), strict=False):
        with contextlib.suppress(Exception):
            runtime.kill(node.name)
    with contextlib.suppress(Exception):
        runtimes[0].kill(server.spec.name)
