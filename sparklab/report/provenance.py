"""Where each cell's numbers come from: its image (digest), the engine version the image states and the one its server
answered, what the image's own parser said of its command, and which figures rest on a format nobody read for that
version (the acceptance counter or log line the engine adapter knows from other versions only). Pure: stored results
and the adapters' knowledge tables (each adapter's KNOWLEDGE) in, report blocks out.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparklab import engines
from sparklab.report.document import Block, Bullets, Para, Section, Table
from sparklab.report.formats import DASH
from sparklab.report.model import Group, Report, Server

MARK = "‡"  # an acceptance figure that rests on a format not read for its engine version


@dataclass(frozen=True)
class Row:
    server: Server
    digest: str | None
    version: str | None  # the image's package metadata (None: not read, or a run from before sparklab read it)
    served: str | None  # the server's version endpoint
    cells: int


def rows(report: Report) -> list[Row]:
    """One row per server config and the (digest, versions) its cells ran on: a resumed run on another image shows
    as two rows. Cells of runs from before schema 5 carry no version: the server config's (its endpoint's) stands."""
    counted: dict[tuple[str, str | None, str | None, str | None], int] = {}
    for group in report.groups:
        for cell in group.cells:
            served = cell.served_version or (None if cell.engine_version else group.server.engine_version)
            key = (group.server.id, cell.image_digest or group.server.image_digest, cell.engine_version, served)
            counted[key] = counted.get(key, 0) + 1
    by_id = {s.id: s for s in report.servers}
    out = [Row(by_id[sid], digest, version, served, n) for (sid, digest, version, served), n in counted.items()]
    measured = {r.server.id for r in out}
    out += [Row(s, s.image_digest, None, s.engine_version, 0) for s in report.servers if s.id not in measured]
    return sorted(out, key=lambda r: r.server.seq)


def cell_version(group: Group) -> str | None:
    """The engine version a group's cells ran (the image's metadata, else its server's endpoint)."""
    for cell in group.cells:
        if cell.engine_version or cell.served_version:
            return cell.engine_version or cell.served_version
    return group.server.engine_version


def unverified_acceptance(group: Group) -> str | None:
    """Why a group's acceptance figure rests on a format not read for its engine version (None: it does not)."""
    kind = group.server.kind
    version = cell_version(group)
    if kind not in engines.ENGINES or version is None or group.metrics.get("acceptance_length") is None:
        return None
    adapter = engines.ENGINES[kind]
    for cell in group.cells:
        fact = adapter.unverified_acceptance(cell.result or {}, version)
        if fact is not None:
            return (f"{group.server.label} at C={group.concurrency} ({group.workload}): its acceptance comes from "
                    f"{fact.what}, read in {adapter.name} {', '.join(fact.read_in)}, not in {version}")
    return None


def mark(group: Group) -> str:
    return f" {MARK}" if unverified_acceptance(group) else ""


def _parser(server: Server) -> str:
    check = server.image_check or {}
    verdict = check.get("verdict") or {}
    if not verdict:
        return DASH
    took = f"{check['first_seconds']:.1f} s, cached" if check.get("cached") and check.get("first_seconds") else \
        f"{float(check.get('seconds') or 0):.1f} s"
    return f"{verdict.get('status')} ({took})"


def _version_notes(report: Report, table: list[Row]) -> list[str]:
    notes: list[str] = []
    for row in table:
        adapter = engines.ENGINES.get(row.server.kind or "")
        if adapter is None:
            continue
        if row.version and row.served and not adapter.same_version(row.version, row.served):
            notes.append(f"{row.server.label}: the image states {row.version}, its server answered {row.served}")
        warning = adapter.version_warning(row.version or row.served, row.server.label) if (row.version or
                                                                                          row.served) else None
        if warning:
            notes.append(warning)
        disagreement = row.server.startup.get("version_disagreement")
        if disagreement:
            notes.append(f"{row.server.label}: {disagreement}")
    notes += [u for g in report.groups if (u := unverified_acceptance(g))]
    return list(dict.fromkeys(notes))


def section(report: Report) -> Section:
    """The provenance table: per server config and image, the engine version (image / server), the parser's
    verdict, and the cells measured on it; then what disagrees or was never read for these versions."""
    table = rows(report)
    body = tuple((r.server.label, r.server.image, (r.digest or DASH)[:19], r.version or DASH, r.served or DASH,
                  _parser(r.server), str(r.cells)) for r in table)
    blocks: list[Block] = [
        Para("Each cell stores the image digest it ran on, the engine version its image's package metadata states "
             "(read before the start, in the same throwaway container as the engine's own parser check) and the "
             "version its server answered once ready (vLLM `GET /version`, SGLang `/server_info`, llama.cpp "
             "`/props`)."),
        Table(("server", "image", "digest", "engine (image)", "engine (server)", "parser check", "cells"), body,
              (False, False, False, False, False, False, True))]
    notes = _version_notes(report, table)
    if notes:
        blocks.append(Bullets(tuple(notes)))
    if any(mark(g) for g in report.groups):
        blocks.append(Para(f"{MARK} in the tables: an acceptance figure read from a counter or log line whose format "
                           "sparklab's engine knowledge never read for that engine version (listed above)."))
    return Section("Provenance: images and engine versions", blocks=blocks)
