"""The sweep's one loop: each host runs one server at a time, taking the next server config it can hold; every cell
and failure goes into the one store on the controller, with the host it ran on.

A sweep without `hosts:` is a fleet of one: this machine alone (`this_machine`), which takes every server config
in plan order in the caller's thread, so Ctrl-C unwinds its server where it runs.

Where the bench client runs: on the controller, reaching each server over the network. The one store, the
clock and the client's own overhead then stay the same for every cell, whichever host served it; a client
next to the server would have to be installed, started and collected on each host, and would share that
host's CPU and memory with the engine it measures (unified memory on a Spark). The network adds its
round trip to TTFT (well under a millisecond on a direct ConnectX-7 or 10 GbE link, against TTFTs of tens of
milliseconds and more), and nothing to inter-token times; the report shows each cell's host, so cells of a
host far away are easy to tell apart.

A server across several hosts (a recipe with `nodes: 2`, sparklab.multinode) takes its host and as many other
idle hosts that can hold it; they serve nothing else until it is done. Its head runs on the host that took it.

A host lost mid-sweep (its daemon or ssh gone) gives its server's cells back: the one in flight returns to
pending without spending an attempt, finished ones stay, and the server configs it ran that still have
pending cells go back to the queue for the other hosts; the lost host takes no more work in this run.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from sparklab.errors import DiskFullError, PreflightError, SparklabError
from sparklab.host import preflight
from sparklab.recipes import multinode
from sparklab.recipes.hosts import LOCAL, Host, redact_url, with_address
from sparklab.recipes.plan import Plan, ServerConfig
from sparklab.recipes.render import render
from sparklab.runtimes import deadlines
from sparklab.runtimes.base import HostRuntime
from sparklab.runtimes.containers import Docker
from sparklab.sweep.hoststore import HostStore
from sparklab.sweep.provenance import DriftError
from sparklab.sweep.store import Store

log = logging.getLogger(__name__)

Say = Callable[[str], None]


# What ends the whole run, on every host: the controller's disk is full, or a resumed run's image drifted.
FATAL = (DiskFullError, DriftError)


PAIR_LOST = "the Docker host stopped answering during a server across hosts"  # a partner's, why it left the run


class HostLost(Exception):
    """A Docker host stopped answering while it ran a server: `hosts` names the ones that went (empty: the host
    that ran it; a server across hosts may lose a worker's host and keep the head's)."""

    def __init__(self, message: str = "", hosts: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.hosts = hosts


@dataclass
class Member:
    """A host taking part in this sweep: a Docker host of the sweep's hosts, or this machine alone."""

    host: Host
    runtime: HostRuntime
    facts: dict[str, Any] = field(default_factory=dict)
    lost: str | None = None  # why it left the sweep
    ran: list[str] = field(default_factory=list)  # server config ids it ran in this run
    pull_policy: str = "missing"
    # This machine alone (a sweep without hosts:): with no other host to choose or to give work back to, it takes
    # every server config (its own start says why one cannot run here, as a failure the report shows), its lines
    # carry no host name, and it is never lost (a Docker daemon that restarts under it is a fault to contain).
    alone: bool = False
    _arch: dict[str, str | None] = field(default_factory=dict)
    _images: dict[tuple[str, ...], str | None] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def recorded_as(self) -> str | None:
        """The host name its cells and failures carry (none for this machine alone, as before there were hosts)."""
        return None if self.alone else self.name

    def tell(self, say: Say) -> Say:
        """say, with this host's name in front (alone: as it is)."""
        return say if self.alone else (lambda message: say(f"[{self.name}] {message}"))

    def gone(self) -> bool:
        """Whether the host stopped answering (never this machine alone)."""
        return not self.alone and not self.runtime.alive()

    def image_problem(self, refs: tuple[str, ...]) -> str | None:
        """None when this host has one of the images (the recipe's, then its alternatives) or can pull it."""
        if refs not in self._images:
            problems = []
            for ref in refs:
                try:
                    problem = self.runtime.image_problem(ref, self.pull_policy)
                except SparklabError as exc:
                    problem = exc.message
                if problem is None:
                    break
                problems.append(problem)
            else:
                self._images[refs] = "; ".join(problems)
                return self._images[refs]
            self._images[refs] = None
        return self._images[refs]

    def image_arch(self, ref: str) -> str | None:
        """The architecture of the image as this host has it; None when it has none yet (a pull there picks
        the host's own platform from a multi-arch image)."""
        if ref not in self._arch:
            try:
                info = self.runtime.image_info(ref)
            except SparklabError:
                info = None
            self._arch[ref] = info.architecture if info is not None else None
        return self._arch[ref]


def this_machine(runtime: HostRuntime, pull_policy: str = "missing", host: Host | None = None) -> Member:
    """This machine alone: the fleet of one of a sweep without hosts: (see Member.alone); host: its one `local`
    entry when the sweep names it (its port_offset moves its servers' ports)."""
    return Member(host or LOCAL, runtime, pull_policy=pull_policy, alone=True)


Connect = Callable[[Host], HostRuntime]  # a Docker host named in a sweep → its runtime (a rehearsal: a twin)



def connect(hosts: list[Host], say: Say, local: HostRuntime | None = None, pull_policy: str = "missing",
            check_s: float = deadlines.HOST_CHECK_S, reach: Connect | None = None) -> list[Member]:
    """Reach every host (preflight: reachable, its platform and memory), all at once and within check_s; a host
    that cannot be reached, or does not answer in time, is left out with one line. reach: how a host is reached
    (None: Docker's remote API; a rehearsal reaches its twins)."""

    told = threading.Lock()
    decided = threading.Event()  # the deadline has passed: a late answer is not told (its host is left out)

    def check(host: Host) -> Member:
        if host.local and local is not None:
            runtime = local
        else:
            runtime = reach(host) if reach is not None else Docker.connect(host.docker, host.tls_dir, answer_s=check_s)
        member = Member(with_address(host, runtime.url), runtime, runtime.facts(), pull_policy=pull_policy)
        with told:  # each host's line as soon as it answered, not after the slowest
            if not decided.is_set():
                facts = member.facts
                say(f"host {member.host.name}: {facts['architecture']}, {facts['mem_total_gib']} GiB, Docker "
                    f"{facts['docker_version']}, ports +{member.host.port_offset}")
        return member

    checked = deadlines.each_within(check_s, {host.name: partial(check, host) for host in hosts})
    with told:
        decided.set()
    members: list[Member] = []
    for host in hosts:
        member = checked[host.name]
        if isinstance(member, Member):
            members.append(member)
        else:
            say(f"host {host.name}: left out of this run: {_why(member, host, check_s)}")
    if not members:
        raise PreflightError("no Docker host of this sweep can be reached",
                             "Check each with `docker -H URL info`; the sweep's cells stay pending.")
    return members


def _why(error: BaseException, host: Host, check_s: float) -> str:
    """One line: why a host could not be checked."""
    if isinstance(error, deadlines.NoAnswer):
        return deadlines.no_answer(redact_url(host.docker), check_s)
    if isinstance(error, SparklabError):
        return error.message.splitlines()[0]
    if isinstance(error, Exception):  # docker-py or the daemon's answer, unexpected: still one line, not a traceback
        log.debug("checking host %s", host.name, exc_info=error)
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    raise error  # Ctrl-C and the like


def unfit(server: ServerConfig, member: Member) -> str | None:
    """Why this host cannot hold this server config (None: it can): its port moved by the host's port_offset, the
    image's platform (as the host has the image, else as its tag names it), the image there or pullable there, and
    the recipe's memory."""
    moved = server.spec.port + member.host.port_offset
    if moved > 65535:
        return (f"port {server.spec.port} + port_offset {member.host.port_offset} = {moved} is not a TCP port "
                "(give the host a smaller port_offset)")
    arch = preflight.arch_name(str(member.facts.get("architecture") or ""))
    wanted = member.image_arch(server.spec.image) or preflight.tag_platform(server.spec.image)
    if wanted and preflight.arch_name(wanted) != arch:
        return f"the image {server.spec.image} is for {preflight.arch_name(wanted)}, the host is {arch}"
    image = member.image_problem((server.spec.image, *server.spec.image_alternatives))
    if image:
        return image
    need = server.recipe.min_available_gib
    total = float(member.facts.get("mem_total_gib") or 0)
    if need and total and total < need:
        return f"the recipe needs {need:g} GiB, the host has {total:g} GiB in all"
    return None


def for_host(server: ServerConfig, host: Host) -> ServerConfig:
    """The server config rendered for this host: its port range, its address as the endpoint, its network."""
    if host.local and host.port_offset == 0 and host.network is None:
        return server
    assert server.options is not None
    options = dataclasses.replace(
        server.options, port=server.spec.port + host.port_offset, address=None if host.local else host.address,
        network=host.network, public=server.options.public or host.remote_address,
        hf_cache=Path(host.hf_cache) if host.hf_cache else server.options.hf_cache)
    spec = render(server.recipe, server.engine, server.method, options)
    return dataclasses.replace(server, spec=spec, options=options)


def for_hosts(server: ServerConfig, hosts: list[Host]) -> ServerConfig:
    """A server across hosts rendered for these (the head on hosts[0]): its head's spec and every node's."""
    head = for_host(server, hosts[0])
    assert head.options is not None
    nodes = multinode.render_cluster(server.recipe, server.engine, server.method, head.options, hosts)
    return dataclasses.replace(head, spec=nodes.head, cluster=nodes)


def mark_lost(exc: HostLost, member: Member, partners: Sequence[Member]) -> list[Member]:
    """Mark lost the hosts a HostLost names among the one that ran the server and its partners (it names none: the
    former): that one with the loss's own words, a partner as PAIR_LOST; one already marked keeps its reason.
    Returns them."""
    went = [m for m in (member, *partners) if m.name in exc.hosts] if exc.hosts else [member]
    for gone in went:
        gone.lost = gone.lost or ((str(exc) or "the Docker host stopped answering") if gone is member else PAIR_LOST)
    return went


def nodes_of(server: ServerConfig) -> int:
    return multinode.nodes_of(server.recipe, server.engine)


class Serve(Protocol):
    """Run this server config's pending cells on this host (and, for a server across hosts, on the partners' too);
    raise HostLost when the host went away under it."""

    def __call__(self, member: Member, server: ServerConfig, store: HostStore, say: Say, /,
                 partners: list[Member] | None = None) -> None: ...


def run(plan: Plan, store: Store, members: list[Member], serve: Serve, say: Say, run_id: str) -> None:
    """Spread the server configs with pending cells over the hosts until none is left or no host can take one.

    Each host works in a thread of its own; this machine alone works in the caller's thread."""
    lock = threading.RLock()
    cond = threading.Condition(lock)
    pending = {c.id for c in store.pending_cells()}
    queue = [s for s in plan.servers if any(c.id in pending for c in s.cells)]
    busy: set[str] = set()
    reserved: set[str] = set()  # hosts serving another host's server across hosts
    stop = threading.Event()
    fatal: list[BaseException] = []  # an error that ends the whole run (FATAL)

    def partners_for(server: ServerConfig, member: Member) -> list[Member] | None:
        """The other idle hosts a server across hosts needs (none needed: []; not enough idle now: None)."""
        need = nodes_of(server) - 1
        idle = [m for m in members if m is not member and m.name not in busy and not m.lost
                and unfit(server, m) is None][:need]
        return idle if len(idle) == need else None

    def take(member: Member) -> tuple[ServerConfig, list[Member]] | None:
        with cond:
            while not stop.is_set() and not member.lost:
                for server in queue if member.name not in reserved else []:
                    fits = member.alone or unfit(server, member) is None
                    partners = partners_for(server, member) if fits else None
                    if partners is not None:
                        queue.remove(server)
                        busy.update([member.name, *(p.name for p in partners)])
                        reserved.update(p.name for p in partners)
                        return server, partners
                if not busy:  # nothing in flight could come back to the queue
                    return None
                cond.wait(1.0)
            return None

    def release(partners: list[Member]) -> None:
        with cond:
            for partner in partners:
                reserved.discard(partner.name)
                busy.discard(partner.name)
                if not partner.lost and partner.gone():  # one the loss named is not asked again
                    partner.lost = PAIR_LOST
            cond.notify_all()

    def give_back(member: Member, lost: str) -> None:
        """The servers `member` ran with cells left go back to the queue, `lost` being the host that went."""
        with cond:
            left = {c.server_config_id for c in store.pending_cells()}
            for server in plan.servers:
                if server.id in member.ran and server.id in left and server not in queue:
                    queue.append(server)
                    say(f"host {lost} lost: server {server.label} goes back to the queue")

    def work(member: Member) -> None:
        hstore = HostStore(store, lock, member.recorded_as, stop)
        host_say = member.tell(say)
        try:
            while (taken := take(member)) is not None:
                server, partners = taken
                member.ran.append(server.id)
                try:
                    if partners:
                        hosts = [member.host, *(p.host for p in partners)]
                        host_say(f"server {server.label}: across {', '.join(h.name for h in hosts)}")
                        serve(member, for_hosts(server, hosts), hstore, host_say, partners=partners)
                    else:
                        serve(member, for_host(server, member.host), hstore, host_say)
                except HostLost as exc:
                    went = mark_lost(exc, member, partners)
                    if member not in went:  # a partner's host went, this one stays: the cells wait for another pair
                        give_back(member, ", ".join(m.name for m in went))
                except (KeyboardInterrupt, *FATAL):
                    raise
                except Exception as exc:  # e.g. the recipe does not render for this host: its cells fail, not the run
                    text = exc.message if isinstance(exc, SparklabError) else f"{type(exc).__name__}: {exc}"
                    log.debug("server %s on %s", server.label, member.name, exc_info=exc)
                    hstore.fail_server_config(server.id, "error", text, max_attempts=plan.sweep.max_attempts)
                    host_say(f"server {server.label}: failed (error): {text.splitlines()[0] if text else ''}")
                else:
                    if member.gone():
                        member.lost = "the Docker host stopped answering after its server"
                finally:
                    release(partners)
                if member.lost:
                    host_say(f"lost: {member.lost}; it takes no more servers in this run")
                    give_back(member, member.name)
                    return
                with cond:
                    busy.discard(member.name)
                    cond.notify_all()
        except KeyboardInterrupt:
            if member.alone:  # the caller's own interrupt: its server came down on the way out
                raise
            log.debug("host %s: stopped by an interrupt", member.name)  # the controller's (see HostStore)
        except FATAL as exc:  # every host stops; the run resumes once the cause is dealt with
            fatal.append(exc)
        finally:
            with cond:
                busy.discard(member.name)
                cond.notify_all()

    if len(members) == 1 and members[0].alone:
        work(members[0])
        if fatal:
            raise fatal[0]
        return
    threads = [threading.Thread(target=work, args=(m,), name=f"host-{m.name}", daemon=True) for m in members]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive() and not fatal:
                thread.join(0.5)
        if fatal:
            raise fatal[0]
    except (KeyboardInterrupt, *FATAL):  # every host's server comes down; cells in flight go back to pending
        stop.set()
        with cond:
            cond.notify_all()
        # What a worker stuck in a request waits on goes away, so it unwinds now: on every host at once, so a
        # host that stopped answering costs its own bound, not the others' too.
        removals = {m.name: partial(m.runtime.remove_run_containers, run_id, wait_s=10) for m in members}
        for name, outcome in deadlines.each_within(2 * deadlines.HOST_CHECK_S, removals).items():
            if isinstance(outcome, BaseException):  # a lost host: the next run's gc removes it
                log.debug("teardown on %s: %s", name, outcome)
        for thread in threads:
            thread.join(30)
        raise
    with cond:
        for server in queue:
            short = f"the server needs {nodes_of(server)} hosts that can hold it" if nodes_of(server) > 1 else None
            reasons = {m.name: m.lost or unfit(server, m) or short for m in members}
            say(f"server {server.label}: no host could take it ("
                + "; ".join(f"{name}: {why}" for name, why in reasons.items()) + "); its cells stay pending")
