"""Before a sweep's (or a tune round's) first server: every pending server config's command through its image's own
parser, one run per image, so a flag the image does not know fails its server config at minute 0, not at its turn
in the night. The rest of the sweep goes on; each start checks again (from the cache) on the host that runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparklab.engines import engine
from sparklab.recipes.plan import Plan
from sparklab.runtimes import imagecheck
from sparklab.runtimes.base import HostRuntime

Say = Callable[[str], None]


def check_pending(plan: Plan, store: Any, runtime: HostRuntime, pull_policy: str, say: Say) -> None:
    """Pull each pending server config's image (by the sweep's pull policy), run the parsers, record each verdict
    with its server config; a refused command fails that server config's cells (no attempt can pass it)."""
    pending = {c.id for c in store.pending_cells()}
    servers = [s for s in plan.servers if s.cluster is None and any(c.id in pending for c in s.cells)]
    if not servers:
        return
    checks = imagecheck.gather([s.spec for s in servers], runtime, pull_policy=pull_policy)
    for server, checked in zip(servers, checks, strict=True):
        store.record_image_check(server.id, checked.as_dict())
        verdict = checked.verdict
        if verdict.status == imagecheck.REJECTED:
            error = imagecheck.refusal(checked, (Path(plan.source),))
            store.fail_server_config(server.id, "preflight", f"{error.message}\n{error.hint}", max_attempts=1)
            say(f"server {server.label}: refused by its image's own parser before any start: {verdict.message}; "
                f"its cells fail, the rest of the sweep goes on")
        elif verdict.status == imagecheck.ACCEPTED:
            took = (f"{checked.seconds:.2f} s, cached from a {checked.first_seconds:.1f} s check" if checked.cached
                    and checked.first_seconds is not None else f"{checked.seconds:.1f} s")
            named = " ".join(x for x in (engine(server.spec.kind).name, verdict.version) if x) or "its engine"
            say(f"server {server.label}: {named}'s own parser accepts its command ({took})")
    for warning in imagecheck.summarize(checks):
        say(f"warning: {warning}")
