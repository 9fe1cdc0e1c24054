"""vLLM 0.27.1 scoring given tokens under the served model (the lossless check, sparklab.sweep.lossless).

POST /tokenize with chat messages (and tools, chat_template_kwargs) gives the prompt's token ids as the chat
template renders them (vllm/entrypoints/serve/tokenize/protocol.py:50-117, serving.py:57-80); POST /v1/completions
with a token-id prompt, max_tokens 1 and prompt_logprobs 0 gives each prompt token's log-probability under the
model (vllm/entrypoints/openai/completion/protocol.py:94, :341-370; -inf clamped to -9999,
vllm/entrypoints/generate/base/serving.py:305-317).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparklab.engines.base import ScoringError
from sparklab.errors import EngineUnreachable as Unreachable

if TYPE_CHECKING:
    from sparklab.engines.api import EngineAPI


def score_answer(api: EngineAPI, model: str, messages: Sequence[dict[str, Any]], extra: dict[str, Any] | None,
                 chat_kwargs: dict[str, Any] | None, answer_ids: Sequence[int]) -> float:
    tokenize: dict[str, Any] = {"model": model, "messages": list(messages), "add_generation_prompt": True}
    if extra and extra.get("tools"):
        tokenize["tools"] = extra["tools"]
    if chat_kwargs:
        tokenize["chat_template_kwargs"] = chat_kwargs
    prompt = _ids(_answer(api, "/tokenize", tokenize), "tokens")
    body = {"model": model, "prompt": [*prompt, *answer_ids], "max_tokens": 1, "prompt_logprobs": 0,
            "temperature": 0}
    choices = _answer(api, "/v1/completions", body).get("choices") or [{}]
    logprobs = choices[0].get("prompt_logprobs")
    if not isinstance(logprobs, list) or len(logprobs) != len(prompt) + len(answer_ids):
        raise ScoringError(f"/v1/completions returned {len(logprobs) if isinstance(logprobs, list) else 'no'} "
                           f"prompt log-probabilities for {len(prompt) + len(answer_ids)} tokens")
    total = 0.0
    for token, entry in zip(answer_ids, logprobs[len(prompt):], strict=True):
        found = (entry or {}).get(str(token))
        if not isinstance(found, dict) or not isinstance(found.get("logprob"), (int, float)):
            raise ScoringError(f"no log-probability for token {token} in vLLM's prompt_logprobs")
        total += float(found["logprob"])
    return total


def _answer(api: EngineAPI, path: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        answer = api.post_json(path, body)
    except Unreachable as exc:
        raise ScoringError(f"{path}: no answer ({exc})") from None
    if answer.status != 200:
        raise ScoringError(f"{path} answered HTTP {answer.status}: {' '.join(answer.text.split())[:200]}")
    try:
        data = answer.json()
    except ValueError:
        raise ScoringError(f"{path} answered 200 but not with JSON") from None
    if not isinstance(data, dict):
        raise ScoringError(f"{path} answered {type(data).__name__}, not an object")
    return data


def _ids(data: dict[str, Any], key: str) -> list[int]:
    ids = data.get(key)
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ScoringError(f"/tokenize gave no token ids ({key})")
    return ids
