"""`sparklab ps`, `down`, `logs` and `gc` over every Docker host sparklab works with, and this machine's host
processes.

The hosts are `--host` (repeatable) when given, else this machine's engine plus those in SPARKLAB_HOSTS
(space- or comma-separated, named as in a sweep file's hosts:). A host that cannot be reached is reported and
skipped; the commands work on the rest.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from sparklab.cli.args import ON_HOSTS, host_option, positive, whole
from sparklab.errors import ContainerError, ServerError, SparklabError
from sparklab.recipes.hosts import LOCAL_NAME, Host, parse_hosts, redact_url
from sparklab.runtimes import containers, deadlines
from sparklab.runtimes.base import Runtime, ServerInfo
from sparklab.runtimes.local import Runtime as LocalRuntime


class Console(Protocol):  # cli's rich consoles; this module prints through them
    def print(self, *objects: Any, **kwargs: Any) -> None: ...


@dataclass(frozen=True)
class PsArgs:
    hosts: tuple[str, ...]  # --host; none: this machine's and those in SPARKLAB_HOSTS

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        host_option(p, ON_HOSTS)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> PsArgs:
        return cls(tuple(args.hosts))


@dataclass(frozen=True)
class DownArgs:
    name: str | None
    all: bool  # every sparklab container you started
    all_users: bool  # every sparklab container, other users' too
    hosts: tuple[str, ...]

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("name", nargs="?", help="container name (see `sparklab ps`)")
        p.add_argument("--all", action="store_true", help="every sparklab container you started")
        p.add_argument("--all-users", action="store_true", help="every sparklab container, other users' too")
        host_option(p, ON_HOSTS)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> DownArgs:
        return cls(args.name, args.all, args.all_users, tuple(args.hosts))


@dataclass(frozen=True)
class LogsArgs:
    name: str | None  # None: the only one
    follow: bool
    tail: str  # the last N lines, or "all"
    hosts: tuple[str, ...]

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("name", nargs="?", help="container name (default: the only one)")
        p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
        p.add_argument("--tail", default="all", help="only the last N lines")
        host_option(p, ON_HOSTS)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> LogsArgs:
        return cls(args.name, args.follow, args.tail, tuple(args.hosts))


@dataclass(frozen=True)
class GcArgs:
    caches: bool  # also list the engine caches and trim them
    keep: int | None  # with caches: keep the N most recently used
    max_gib: float | None  # with caches: remove the least recently used until the rest fits
    hosts: tuple[str, ...]

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("--caches", action="store_true",
                       help="also list the engine caches (per image digest: size, last use) and trim them")
        p.add_argument("--keep", type=whole(0, 1_000_000), metavar="N",
                       help="with --caches: keep the N most recently used, remove the rest")
        p.add_argument("--max-gib", type=positive(1e6), metavar="GIB",
                       help="with --caches: remove the least recently used until the rest fits in GIB")
        host_option(p, ON_HOSTS)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> GcArgs:
        return cls(args.caches, args.keep, args.max_gib, tuple(args.hosts))


def chosen_hosts(values: tuple[str, ...]) -> list[Host]:
    if values:
        return parse_hosts(values, "--host")
    extra = [v for v in re.split(r"[\s,]+", os.environ.get("SPARKLAB_HOSTS", "")) if v]
    return parse_hosts([LOCAL_NAME, *[v for v in extra if v != LOCAL_NAME]], "SPARKLAB_HOSTS")


def reach(hosts: list[Host], err: Console, check_s: float = deadlines.HOST_CHECK_S) -> list[tuple[Host, Runtime]]:
    """The hosts that answer within check_s (asked all at once); each one that does not is named on stderr (all
    silent: the first error)."""

    def connect(host: Host) -> Runtime:
        # this machine: its containers and its host-process servers (runtimes.local); another: its Docker
        return LocalRuntime() if host.local else containers.Docker.connect(host.docker, host.tls_dir, answer_s=check_s)

    answers = deadlines.each_within(check_s, {host.name: partial(connect, host) for host in hosts})
    reached: list[tuple[Host, Runtime]] = []
    first: SparklabError | None = None
    for host in hosts:
        answer = answers[host.name]
        if isinstance(answer, deadlines.NoAnswer):
            answer = ContainerError(deadlines.no_answer(redact_url(host.docker), check_s))
        if isinstance(answer, SparklabError):
            first = first or answer
            err.print(f"host {host.name}: unreachable ({answer.message})", markup=False)
        elif isinstance(answer, BaseException):
            raise answer
        else:
            reached.append((host, answer))
    if not reached and first is not None:
        raise first
    return reached


def connect_every(hosts: list[Host], check_s: float = deadlines.HOST_CHECK_S) -> list[containers.Docker]:
    """Every host's Docker, asked all at once within check_s (a server across hosts needs each one): the first
    host that cannot be reached, or gives no answer in time, is the error."""
    answers = deadlines.each_within(check_s, {h.name: partial(containers.Docker.connect, h.docker, h.tls_dir,
                                                              answer_s=check_s) for h in hosts})
    reached: list[containers.Docker] = []
    for host in hosts:
        answer = answers[host.name]
        if isinstance(answer, deadlines.NoAnswer):
            raise ContainerError(f"host {host.name}: {deadlines.no_answer(redact_url(host.docker), check_s)}",
                                 "A server across hosts needs every one of them.")
        if isinstance(answer, BaseException):
            raise answer
        reached.append(answer)
    return reached


def _listed(reached: list[tuple[Host, Runtime]]) -> list[tuple[Host, Runtime, ServerInfo]]:
    return [(host, runtime, info) for host, runtime in reached for info in runtime.containers()]


def cmd_ps(args: PsArgs, out: Console, err: Console) -> int:
    from sparklab.cli.console import ps_table

    hosts = chosen_hosts(args.hosts)
    listed = _listed(reach(hosts, err))
    out.print(ps_table([c for _, _, c in listed], [h.name for h, _, _ in listed] if len(hosts) > 1 else None))
    return 0


def cmd_down(args: DownArgs, out: Console, err: Console) -> int:
    listed = _listed(reach(chosen_hosts(args.hosts), err))
    if args.all_users or args.all:
        targets = [(h, d, c) for h, d, c in listed if args.all_users or c.mine]
        others = len(listed) - len(targets)
        if others:
            err.print(f"left {others} container(s) of other users (or from before sparklab labelled users): "
                      "sparklab down --all-users removes them too", markup=False)
    elif args.name:
        targets = [(h, d, c) for h, d, c in listed if c.name == args.name]
        if not targets:
            raise ServerError(f"no sparklab container named {args.name}", "List them with `sparklab ps`.")
    else:
        targets = [(h, d, c) for h, d, c in listed if c.labels.get("sparklab.mode") == "up" and c.mine]
        if len(targets) != 1:
            names = ", ".join(c.name for _, _, c in targets) or "none"
            raise SparklabError(f"say which server to stop (sparklab up containers: {names})",
                                "sparklab down NAME, or sparklab down --all")
    for host, runtime, info in targets:
        runtime.remove(info.name)
        out.print(f"removed {info.name}" + ("" if host.local else f" on {host.name}"))
    if not targets:
        out.print("no sparklab containers")
    return 0


def cmd_logs(args: LogsArgs, out: Console, err: Console) -> int:
    listed = _listed(reach(chosen_hosts(args.hosts), err))
    found = [(h, d, c) for h, d, c in listed if args.name in (None, c.name)]
    if len(found) != 1:
        names = ", ".join(f"{c.name}@{h.name}" for h, _, c in found) or "none"
        raise SparklabError(f"say whose logs to show (sparklab containers: {names})",
                            "sparklab logs NAME (with --host HOST when the name is on several hosts)")
    _, runtime, info = found[0]
    tail: int | str = int(args.tail) if str(args.tail).isdigit() else "all"
    for chunk in runtime.logs(info.name, follow=args.follow, tail=tail):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
    return 0


def cmd_gc(args: GcArgs, out: Console, err: Console) -> int:
    from sparklab.engines import caches as engine_cache

    removed = 0
    local: Runtime | None = None
    for host, runtime in reach(chosen_hosts(args.hosts), err):
        local = runtime if host.local else local
        for info in runtime.gc():
            removed += 1
            where = "" if host.local else f" on {host.name}"
            out.print(f"removed {info.name}{where} ({info.status}; its sparklab process is gone)")
    out.print(f"{removed} leftover container(s) removed")
    if args.caches and local is not None:  # after the containers: a leftover no longer holds its cache
        caches = engine_cache.scan(engine_cache.default_root(), local.mount_sources())
        gone = engine_cache.remove(engine_cache.choose_trim(caches, args.keep, args.max_gib))
        out.print("\n".join([f"engine caches in {engine_cache.default_root()}:",
                             *engine_cache.describe(caches, gone)]), markup=False)
    return 0
