"""Before a server starts on unified memory: free the page cache of the model's own files when MemFree is short of
what the engine will ask for, on whichever host the server runs (its facts, host/facts.py).

The choice, posix_fadvise over the model's files rather than a privileged helper container writing
/proc/sys/vm/drop_caches: the failing case (vllm#48140, MiaAI-Lab/Qwen3.8-Flash-Next-Dual-DGX-Sparks#35) is exactly
this page cache, the previous server's weights; fadvise needs no privilege, no image and no Docker (rootless Docker
and hosts that forbid --privileged included), and it drops only sparklab's own files, not the cache of whatever else
shares the host. What it cannot reach (other files' cache) is said, with the command that would; sparklab running
as root on that host (the old `--drop-caches`) also drops the rest.
"""

from __future__ import annotations

from collections.abc import Callable

from sparklab.host.facts import HostFacts
from sparklab.host.memory import GIB, HostMemory, engine_need
from sparklab.recipes.schema import Recipe
from sparklab.spec import LaunchSpec

Say = Callable[[str], None]


def free_page_cache(recipe: Recipe, spec: LaunchSpec, say: Say, facts: HostFacts, *,
                    every_recipe: bool = False) -> HostMemory | None:
    """When MemFree on the host is short of the engine's need, drop the page cache of the model's own files.
    Returns the memory after, or None when nothing needed freeing. every_recipe: free for any recipe
    (`--drop-caches`), not only unified-memory ones."""
    before = facts.meminfo()
    need = engine_need(spec, before.total_gib) if (recipe.unified_memory or every_recipe) else None
    if need is None or before.free_gib >= need.gib:
        return None
    count, size = facts.evict_model_files(recipe, spec)
    after = facts.meminfo()
    on = "" if facts.where == "this machine" else f" on {facts.where}"
    say(f"memory{on}: MemFree {before.free_gib:.1f} GiB < {need.gib:.1f} GiB ({need.flag} {need.fraction:g}): "
        f"dropped the page cache of {count} model files ({size / GIB:.1f} GiB) with posix_fadvise; "
        f"MemFree {before.free_gib:.1f} → {after.free_gib:.1f} GiB")
    if after.free_gib >= need.gib:
        return after
    if facts.drop_all_page_cache():
        after = facts.meminfo()
        say(f"memory{on}: dropped the whole page cache (drop_caches, as root); MemFree {after.free_gib:.1f} GiB")
        return after
    say(f"memory{on}: MemFree is still short by {need.gib - after.free_gib:.1f} GiB (other files' page cache, "
        f"{after.cached_gib:.1f} GiB cached): the engine may refuse to start. Free it with "
        "`sudo sh -c 'sync; echo 3 > /proc/sys/vm/drop_caches'`, or lower " + need.flag)
    return after
