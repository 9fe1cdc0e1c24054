"""A run belongs to one sweep and is one set of images, recipes and sampling: what a resumed run must still match.

A run stores a fingerprint when it is created: a hash of the recipe file's content and the sampling settings. Each
server config keeps what its launch sets beside its argv and image (which its id hashes): its environment (as
digests), IPC mode, shared memory, ulimits, GPUs, platform and runtime, so a sweep file's `set:` that changes only
the environment is seen too. Resuming with a changed recipe or sampling, a server whose launch changed after it
measured cells, or on a server whose image digest differs from the one its earlier cells ran on, would mix two
experiments in one table; sparklab refuses unless told (`--allow-drift`),
and then the run keeps a 'drift' failure row and the report marks cells from different digests.

Before any of that, the run must be this sweep's: its stored sweep name is compared (read-only, so a file that
is not the sweep's is never migrated or written), and a tune's run is never a sweep's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparklab.errors import SparklabError
from sparklab.inputs import MAX_TEXT_BYTES, read_bounded
from sparklab.recipes.plan import Plan, recipe_file
from sparklab.spec import LaunchSpec
from sparklab.sweep.store import Store

# Any: fingerprints and launches are JSON documents stored with the run and its server configs

META_KEY = "provenance"
Say = Callable[[str], None]
_Fix = tuple[str, list[str], dict[str, Any]]  # a server's label, the launch settings that changed, its new launch
FIX = ("Start a new run for the changed setup (`sparklab sweep FILE --new`), put the old recipe or sampling back, "
       "or add `--allow-drift` to mix them in this run knowingly (the report then marks the cells).")


class DriftError(SparklabError):
    """A resumed run no longer matches what its earlier cells measured."""

    exit_code = 8


def fingerprint(recipe_file: Path, sampling: dict[str, Any]) -> dict[str, Any]:
    return {"recipe_file": str(recipe_file),
            "recipe_sha256": hashlib.sha256(read_bounded(recipe_file, MAX_TEXT_BYTES)).hexdigest(),
            "sampling": sampling}


def drift(stored: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """What changed since the run was created (empty: nothing, or a run from before fingerprints)."""
    if not stored:
        return []
    changes = []
    if stored.get("recipe_sha256") != current["recipe_sha256"]:
        changes.append(f"the recipe {current['recipe_file']} changed (sha256 {str(stored.get('recipe_sha256'))[:12]}"
                       f" -> {current['recipe_sha256'][:12]})")
    if stored.get("sampling") != current["sampling"]:
        keys = sorted(k for k in {*stored.get("sampling", {}), *current["sampling"]}
                      if (stored.get("sampling") or {}).get(k) != current["sampling"].get(k))
        changes.append("sampling changed: " + ", ".join(
            f"{k} {(stored.get('sampling') or {}).get(k)!r} -> {current['sampling'].get(k)!r}" for k in keys))
    return changes


# Any: JSON stored with the server config
def launch_facts(spec: LaunchSpec) -> dict[str, Any]:
    """What a server's launch sets beside its argv and image. Environment values are kept as digests: a token
    written into a recipe's environment never reaches results.sqlite, and a changed value is still seen."""
    return {"env": {name: hashlib.sha256(value.encode()).hexdigest()[:16] for name, value in sorted(spec.env.items())},
            "ipc": spec.ipc, "shm_size": spec.shm_size, "gpus": spec.gpus, "platform": spec.platform,
            "runtime": spec.runtime, "ulimits": {name: list(limits) for name, limits in sorted(spec.ulimits.items())}}


def launch_changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The launch settings that differ, by name (environment values never shown: only their names)."""
    before, after = stored.get("env") or {}, current["env"]
    changed = [f"environment {name}" for name in sorted({*before, *after}) if before.get(name) != after.get(name)]
    return changed + [key for key in current if key != "env" and stored.get(key) != current[key]]


def refuse(run: str, changes: list[str], fix: str = FIX) -> DriftError:
    return DriftError(f"run {run}: {'; '.join(changes)} since its earlier cells ran; resuming would mix two "
                      "setups in one report.", fix)


def image_changes(label: str, earlier: set[str], digest: str | None) -> list[str]:
    """The server's image digest against those its config's earlier cells ran on."""
    if digest is None or not earlier or digest in earlier:
        return []
    return [f"server {label}'s image is now {digest}, its earlier cells ran on {', '.join(sorted(earlier))}"]


def from_meta(meta: dict[str, str]) -> dict[str, Any] | None:
    text = meta.get(META_KEY)
    return json.loads(text) if text else None


def check_owner(results: Path, sweep_name: str, sweep_file: Path | str) -> None:
    """The run at `results` belongs to the sweep `sweep_name`; else an error naming both sweeps. The file is read
    read-only: a run this command does not own is never migrated."""
    run = results.parent.name
    with Store.open(results, readonly=True) as store:
        meta = store.meta()
    try:
        stored = json.loads(meta.get("sweep") or "{}").get("name")
    except (ValueError, AttributeError):
        stored = None
    if "tune" in meta:
        raise SparklabError(f"run {run} is a `sparklab tune` run (of the space {stored!r}), not a run of sweep "
                            f"{sweep_name!r} ({sweep_file}); a sweep's cells would mix into the tune's search.",
                            f"Continue it with `sparklab tune {stored} --resume {run}`, or start the sweep's own run "
                            "(leave out --resume).")
    if stored != sweep_name:
        raise SparklabError(f"run {run} belongs to sweep {stored!r}, not {sweep_name!r} ({sweep_file}); resuming it "
                            "would add this sweep's cells to another sweep's run.",
                            f"Resume it with sweep {stored!r}'s own file, or leave out --resume to continue (or start) "
                            f"a run of {sweep_name!r}.")


# Any: JSON stored with the run, which a resumed run must still match
def plan_fingerprint(plan: Plan) -> dict[str, Any]:
    return fingerprint(recipe_file(plan.sweep, Path(plan.source)), plan.sweep.sampling.model_dump())


def check_drift(plan: Plan, store: Store, exists: bool, allow: bool, say: Say, fix: str = FIX) -> None:
    """Before anything is added to a resumed run (a sweep's or a tune's): the recipe, sampling and each server's
    launch its cells measured, unchanged. fix: the refusal's hint (the command's own way out)."""
    current = plan_fingerprint(plan)
    changes, fixed = _drift(plan, store, current) if exists else ([], {})
    if changes and _measured_nothing(store):  # its attempts measured nothing: a fix
        say(f"{'; '.join(changes)} since the run's last attempt; no cell had finished, so the run goes on with "
            "the new setup")
        changes = []
    if changes and not allow:
        raise refuse(store.path.parent.name, changes, fix)
    if changes:
        store.record_failure("drift", "; ".join(changes) + " (--allow-drift)")
        say(f"drift allowed: {'; '.join(changes)}")
    if not changes or not store.meta().get(META_KEY):
        store.set_meta(META_KEY, current)
    for server_id, (label, what, launch) in fixed.items():
        say(f"server {label}: {', '.join(what)} changed; none of its cells had finished, so it runs with the new "
            "setup")
        store.set_server_launch(server_id, launch)


def drift_refusal(plan: Plan, store: Store, fix: str = FIX) -> DriftError | None:
    """The refusal check_drift would raise on resuming this run without --allow-drift (None: it would go on);
    it only reads, for a dry run."""
    changes, _ = _drift(plan, store, plan_fingerprint(plan))
    return refuse(store.path.parent.name, changes, fix) if changes and not _measured_nothing(store) else None


def _measured_nothing(store: Store) -> bool:
    """The run was attempted and no cell finished: a changed setup is a fix, not two setups in one table."""
    counts = store.counts()
    tried = bool(store.failures()) or store.attempted()
    return tried and not counts["done"] + counts["partial"]


# Any: JSON stored with the server config
def _drift(plan: Plan, store: Store, current: dict[str, Any]) -> tuple[list[str], dict[str, _Fix]]:
    """(what changed under cells already measured: the recipe, the sampling, a server's launch; the servers whose
    launch (environment, IPC, shared memory, ulimits …) changed before they measured anything: a fix)."""
    changes = drift(from_meta(store.meta()), current)
    stored = {row.id: row.config.get("launch") for row in store.server_configs()}
    measured = store.measured_per_server()
    fixed = {}
    for server in plan.servers:
        before = stored.get(server.id)
        if not before:  # a new server, or a run from before launches were stored
            continue
        launch = launch_facts(server.spec)
        what = launch_changes(before, launch)
        if what and measured.get(server.id):
            changes.append(f"server {server.label}'s {', '.join(what)} changed ({measured[server.id]} measured "
                           "cell(s) ran with the earlier setup)")
        elif what:
            fixed[server.id] = (server.label, what, launch)
    return changes, fixed
