"""What a rehearsal says of the real night (pure over its record): the ETA, the timeline with each server's time to
ready and memory against its floor, every server and cell the night would lose and why, and the exit code: 0 when
the night would keep every server and cell, 1 when it would lose one."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

from sparklab.host.clocks import describe
from sparklab.host.twin import TwinServer
from sparklab.host.watchdog import floor_for
from sparklab.rehearse.eta import clock
from sparklab.rehearse.night import Rehearsal
from sparklab.sweep.store import Store

FLOOR_LINE = re.compile(r"^memory floor for (?P<label>.+?)(?: on (?P<host>\S+))?: (?P<floor>[\d.]+) GiB")
FLOOR_FAILURE = "memory-floor"  # the store's failure kind when the memory floor stopped a server
READY_LINE = re.compile(r"^server (?P<label>.+?): ready in (?P<s>[\d.]+) s")
# a start that lost its server (sparklab.sweep.serverrun, .failures): failed (kind): why, or exited with code N
LOST_LINE = re.compile(r"^server (?P<label>.+?): (?:failed \((?P<kind>[^)]+)\): (?P<why>.*?)"
                       r"(?:; its unfinished cells go back to the queue.*)?|(?P<exited>exited with code -?\d+); its "
                       r"remaining cells failed)$")


@dataclass
class _Load:
    """One start of a server config, as the night's lines tell it (a config can start several times: tune's
    reloads, the lossless check's `none`, a start again after its engine died)."""

    label: str
    wall: float  # seconds after the night began
    ready_s: float | None = None  # the sweep's own measure, on the night's clock
    lost: str | None = None


def _plain(line: str) -> str:
    """A night's line without its host in front and its progress counts behind."""
    return re.sub(r" \[\d+ done.*\]$", "", re.sub(r"^\[[^\]]+\] ", "", line))


def _loads(lines: list[tuple[float, str]]) -> list[_Load]:
    loads: list[_Load] = []
    for wall, said in lines:
        line = _plain(said)
        if line.startswith("server ") and ": starting" in line:
            loads.append(_Load(line.split(": starting")[0].removeprefix("server "), wall))
        elif (m := READY_LINE.match(line) or LOST_LINE.match(line)) is not None:
            last = next((load for load in reversed(loads) if load.label == m["label"]), None)
            if last is not None and "s" in m.groupdict():
                last.ready_s = float(m["s"])
            elif last is not None:
                last.lost = f"{m['kind']}: {m['why']}" if m["kind"] else f"{m['exited']}: its remaining cells failed"
    return loads


@dataclass(frozen=True)
class ServerVerdict:
    label: str
    host: str
    started_at_s: float | None  # on the night's clock
    ready_s: float | None
    at_start: tuple[float, float] | None  # (MemAvailable, MemFree) GiB
    lowest: tuple[float, float] | None  # under load
    floor_gib: float | None
    lost: str | None  # why the night would lose it
    node_rank: int | None = None  # one node of a server across hosts (each has its row, on its host)


@dataclass
class Verdict:
    servers: list[ServerVerdict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # every lost cell or server, with why
    lost_cells: int = 0
    floor_trips: int = 0
    clocks: list[str] = field(default_factory=list)  # cells whose clock fell or whose GPU throttled (not losses)

    @property
    def exit_code(self) -> int:
        return 1 if self.failures or self.lost_cells else 0


def judge(rehearsal: Rehearsal) -> Verdict:
    verdict = Verdict()
    floors: dict[tuple[str, str | None], float] = {}
    for _, said in rehearsal.lines:
        if (m := FLOOR_LINE.match(_plain(said))) is not None:
            floors[(m["label"], m["host"])] = float(m["floor"])
    loads = _loads(rehearsal.lines)
    failures: list[tuple[str, str]] = []
    if rehearsal.run_dir is not None:
        with Store.open(rehearsal.run_dir / "results.sqlite") as store:
            labels = {s.id: s.config.get("label", s.id) for s in store.server_configs()}
            for f in store.failures():
                if f.kind in ("drift",):
                    continue
                where = labels.get(f.server_config_id or "", "the sweep")
                failures.append((where, f"{f.kind}: {f.message.splitlines()[0]}"))
                verdict.floor_trips += f.kind == FLOOR_FAILURE
            for cell in store.cells("done"):
                flagged = describe((cell.result or {}).get("gpu_clocks") or {})
                if flagged:
                    verdict.clocks.append(f"{labels.get(cell.server_config_id, '?')} c={cell.concurrency} "
                                          f"{cell.workload} #{cell.repeat}: {flagged}")
            counts = store.counts()
            verdict.lost_cells = counts.get("failed", 0) + counts.get("pending", 0) + counts.get("partial", 0) + \
                counts.get("running", 0)
    for where, why in failures:  # a cell lost while its server was kept (e.g. require_ok): on the config's last load
        same = [load for load in loads if load.label == where]
        if same and not any(load.lost for load in same):
            same[-1].lost = why
    reached: set[int] = set()
    for host_name, host in rehearsal.hosts.items():
        taken: set[int] = set()
        for server in host.history:  # its k-th start of a config is that config's k-th start on the night's lines
            i = next((i for i, load in enumerate(loads) if load.label == server.label and i not in taken), None)
            if i is not None:
                taken.add(i)
            verdict.servers.append(_server(rehearsal, server, host_name, floors, loads[i] if i is not None else None))
        reached |= taken
    for i, load in enumerate(loads):  # starts refused before they reached a twin (a lost host)
        if i not in reached and load.lost:
            verdict.servers.append(ServerVerdict(load.label, "-", rehearsal.night_s(load.wall), None, None, None, None,
                                                 load.lost))
    seen = {s.label for s in verdict.servers}
    for where, why in failures:  # a config lost with no start on the night's lines
        if where not in seen and where != "the sweep":
            seen.add(where)
            verdict.servers.append(ServerVerdict(where, "-", None, None, None, None, None, why))
    verdict.failures = [f"{where}: {why}" for where, why in failures]
    if rehearsal.stopped and not any(rehearsal.stopped.splitlines()[0] in f for f in verdict.failures):
        verdict.failures.append(f"the night stopped: {rehearsal.stopped.splitlines()[0]}")
    verdict.floor_trips = max(verdict.floor_trips, sum("memory floor" in f for f in verdict.failures))
    return verdict


def _server(rehearsal: Rehearsal, server: TwinServer, host: str, floors: dict[tuple[str, str | None], float],
            load: _Load | None) -> ServerVerdict:
    name = None if len(rehearsal.hosts) == 1 else host
    floor = floors.get((server.label, name), floors.get((server.label, None)))
    planned = next((p for p in rehearsal.plan.servers if p.label == server.label), None)
    if floor is None and planned is not None:  # no fraction to derive it from: the watchdog's own default
        floor = floor_for(planned.recipe, rehearsal.plan.sweep.memory_floor_gib)
    at_start = (server.at_start.available_gib, server.at_start.free_gib) if server.at_start else None
    lowest = None if math.isinf(server.lowest_available_gib) else (server.lowest_available_gib, server.lowest_free_gib)
    if load is None:
        return ServerVerdict(server.label, host, None, None, at_start, lowest, floor, None, server.node_rank)
    return ServerVerdict(server.label, host, rehearsal.night_s(load.wall), load.ready_s, at_start, lowest, floor,
                         load.lost, server.node_rank)


def lines(rehearsal: Rehearsal, verdict: Verdict) -> list[str]:
    """The verdict as text: ETA, timeline, memory, losses."""
    eta = rehearsal.eta
    out = [f"rehearsal of `sparklab {rehearsal.command} {rehearsal.request.target}` on the {rehearsal.twin.name} twin "
           f"({rehearsal.twin.mem_total_gib:.1f} GiB unified, OS baseline {rehearsal.twin.os_baseline_gib:.1f} GiB): "
           f"{rehearsal.wall_s:.0f} s of wall time for {rehearsal.night_s(rehearsal.wall_s) / 60:.0f} min of the night "
           f"(1 s = {1 / rehearsal.scale:.0f} s" + (f"; {rehearsal.scale_note}" if rehearsal.scale_note else "") + ")",
           f"the real night: downloads before the clock {clock(eta.download_s)} (images and checkpoints at "
           f"{rehearsal.twin.host.download_mbps:g} MB/s); then {clock(eta.night_s)} by the twin's model"
           + (f", up to {clock(eta.longest_s)} if repeats: auto runs every repeat" if eta.longest_s > eta.night_s
              else "")
           + f"; at the rehearsal's own pace {clock(rehearsal.night_s(rehearsal.wall_s))} (with the stand-ins' own "
             "work per request, which counts more the harder the night is compressed)", "",
           "timeline (night clock)  server                 ready    MemAvailable/MemFree at start  lowest under load"
           "   floor   verdict"]
    for s in verdict.servers:
        start = clock(s.started_at_s) if s.started_at_s is not None else "-"
        ready = f"{s.ready_s:.0f} s" if s.ready_s else "never"
        at = f"{s.at_start[0]:.1f} / {s.at_start[1]:.1f} GiB" if s.at_start else "-"
        low = f"{s.lowest[0]:.1f} / {s.lowest[1]:.1f} GiB" if s.lowest else "-"
        floor = f"{s.floor_gib:.2f}" if s.floor_gib is not None else "-"
        verdict_text = "LOST: " + s.lost if s.lost else "kept"
        where = f"{s.host}: " if len(rehearsal.hosts) > 1 else ""
        role = "" if s.node_rank is None else f" ({'head' if s.node_rank == 0 else 'worker'})"  # one server's nodes
        name = where + s.label + role
        out.append(f"  {start:>9}  {name:<28} {ready:>7}   {at:<28}  {low:<20} {floor:>6}   {verdict_text}")
    out.append("")
    if verdict.clocks:
        out.append(f"{len(verdict.clocks)} cell(s) ran with the clock down or the GPU throttling (their numbers are "
                   "low, the report flags them):")
        out += [f"  - {c}" for c in verdict.clocks[:10]] + ([f"  - and {len(verdict.clocks) - 10} more"]
                                                           if len(verdict.clocks) > 10 else [])
    return out + losses(verdict)


def losses(verdict: Verdict) -> list[str]:
    """The cells the night would lose, then each failure with its cause, said once with how often (a host that is
    gone refuses every retry of a config the same way)."""
    if not (verdict.failures or verdict.lost_cells):
        return ["the real night keeps every server and every cell: 0 floor trips, 0 cells lost"]
    out = [f"the real night would lose {verdict.lost_cells} cell(s); what failed, and why:" if verdict.lost_cells
           else "the real night would lose no cell; what failed, and why:"]
    for failure, times in Counter(verdict.failures).items():  # in the order first said
        out.append(f"  - {failure}" + (f" ({times} times)" if times > 1 else ""))
    return out
