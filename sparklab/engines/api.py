"""The only module that talks HTTP to an engine outside the chat stream: readiness probes, /v1/models,
/metrics, /server_info, /version, prefix-cache resets. Engine adapters say which paths mean what; this
module only sends them (tests/unit/test_architecture.py pins `requests` here and in containers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests

from sparklab.errors import EngineUnreachable as Unreachable
from sparklab.errors import SparklabError

TIMEOUT_S = 10.0

@dataclass(frozen=True)
class Answer:
    status: int
    text: str

    def json(self) -> Any:
        import json

        return json.loads(self.text)


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True)
class EngineAPI:
    """One engine's HTTP root (http://host:port, without /v1) and the key it wants."""

    root: str
    api_key: str | None = None

    def get(self, path: str, timeout_s: float = TIMEOUT_S, with_key: bool = True) -> Answer:
        """GET root+path; raises Unreachable when nothing answers."""
        try:
            response = requests.get(self.root + path, headers=_headers(self.api_key if with_key else None),
                                    timeout=timeout_s)
        except requests.RequestException as exc:
            raise Unreachable(str(exc)) from None
        return Answer(response.status_code, response.text)

    def post(self, path: str, timeout_s: float = 30.0) -> Answer:
        try:
            response = requests.post(self.root + path, headers=_headers(self.api_key), timeout=timeout_s)
        except requests.RequestException as exc:
            raise Unreachable(str(exc)) from None
        return Answer(response.status_code, response.text)

    def post_json(self, path: str, body: Any, timeout_s: float = 120.0) -> Answer:
        """POST a JSON body (the lossless check's scoring requests); raises Unreachable when nothing answers."""
        try:
            response = requests.post(self.root + path, json=body, headers=_headers(self.api_key), timeout=timeout_s)
        except requests.RequestException as exc:
            raise Unreachable(str(exc)) from None
        return Answer(response.status_code, response.text)

    def get_json(self, path: str, timeout_s: float = TIMEOUT_S) -> Any:
        """GET JSON for a user-facing command: every failure is a SparklabError that says what to do."""
        url = self.root + path
        try:
            answer = self.get(path, timeout_s)
        except Unreachable as exc:
            raise SparklabError(f"cannot reach {url}: {exc}", "Is the server up? Check --url (sparklab ps).") from None
        if answer.status in (401, 403):
            raise SparklabError(f"{url} answered {answer.status}: wrong or missing API key",
                                "Pass --api-key (sparklab up printed it) or use --container NAME.")
        if answer.status != 200:
            raise SparklabError(f"{url} answered HTTP {answer.status}")
        try:
            return answer.json()
        except ValueError:
            raise SparklabError(f"{url} answered 200 but not with JSON") from None

    def alive(self, timeout_s: float = 5.0) -> bool:
        """GET /health (vLLM and SGLang serve it): alive unless nothing answers or it answers 5xx. A server
        without /health (404) is not presumed dead. The client's stall detector asks this."""
        try:
            return self.get("/health", timeout_s).status < 500
        except Unreachable:
            return False

    def first_model(self) -> str:
        """The first model the server lists (GET /v1/models)."""
        models = self.get_json("/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if not data or not isinstance(data, list) or not isinstance(data[0], dict) or "id" not in data[0]:
            raise SparklabError(f"{self.root}/v1/models lists no model", "Name one with --model.")
        return str(data[0]["id"])


def probe(url: str, headers: dict[str, str] | None, timeout_s: float = 5.0) -> int:
    """One readiness try: the HTTP status of GET url; raises Unreachable when nothing answers."""
    try:
        return requests.get(url, headers=headers, timeout=timeout_s).status_code
    except requests.RequestException as exc:
        raise Unreachable(str(exc)) from None
