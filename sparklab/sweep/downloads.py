"""What each server of a sweep waited for before its container started: its model checkpoints (fetched once for the
whole plan, before any clock) and its image; seed 002 measured download plus start per model (371 s for one)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sparklab.recipes.plan import Plan
from sparklab.sweep.store import Store

DOWNLOADS_META = "downloads"  # meta key: per server config id, the model downloads it waited for (this run's)


def download(plan: Plan, store: Store, say: Callable[[str], None]) -> None:
    """Every checkpoint the servers mount into the cache, before any clock starts; revisions kept with the run,
    and how long each server waited for its own (a checkpoint counts for the first server that needs it)."""
    from sparklab.host.downloads import checkpoints
    from sparklab.runtimes import pull

    fetched = pull.pull([(s.recipe, s.spec) for s in plan.servers], pull_image=None, say=say)
    if fetched.models:
        store.set_host_facts({"model_revisions": fetched.revisions()})
    by_repo = {(f.checkpoint.repo_id, f.checkpoint.cache_dir): f for f in fetched.models}
    seen: set[tuple[str, Any]] = set()
    per_server: dict[str, dict[str, Any]] = {}
    for server in plan.servers:
        mine = [f for c in checkpoints(server.recipe, server.spec)
                if (f := by_repo.get((c.repo_id, c.cache_dir))) is not None and (c.repo_id, c.cache_dir) not in seen]
        seen.update((f.checkpoint.repo_id, f.checkpoint.cache_dir) for f in mine)
        per_server[server.id] = {"seconds": sum(f.seconds for f in mine),
                                 "bytes": sum(f.bytes_received for f in mine),
                                 "models": [f.checkpoint.repo_id for f in mine]}
    store.set_meta(DOWNLOADS_META, per_server)


# Any: JSON stored with the run (download records)
def waited_for(store: Any, server_id: str, image_s: float | None) -> dict[str, Any]:
    """This server's share of the run's model downloads (a checkpoint counts for the first server that needs it)
    and making sure of its image just before this start."""
    models = (json.loads(store.meta().get(DOWNLOADS_META) or "{}")).get(server_id) or {}
    total = (models.get("seconds") or 0.0) + (image_s or 0.0)
    return {**models, "image_s": image_s, "total_s": total,
            "source": "model checkpoints fetched by the sweep before its first server (huggingface_hub), and the "
                      "image pull or look-up just before this start"}
