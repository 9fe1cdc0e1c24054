"""Per-engine knowledge: flags, endpoints, speculative methods, startup-log facts and known failures."""

from __future__ import annotations

from sparklab.engines import sglang, vllm
from sparklab.engines.base import EngineKnowledge

ENGINES: dict[str, EngineKnowledge] = {"vllm": vllm.KNOWLEDGE, "sglang": sglang.KNOWLEDGE}


def knowledge(kind: str) -> EngineKnowledge:
    return ENGINES[kind]
