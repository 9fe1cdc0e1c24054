"""A Hugging Face Hub stand-in on 127.0.0.1: the part of the Hub API that `snapshot_download` uses.

What huggingface_hub 2.x asks, read from its source (`_snapshot_download.py`, `file_download.py`, `hf_api.py`):
1. `GET /api/models/{repo}/revision/{rev}` (repo_info): JSON with `id` and `sha` (the commit).
2. `GET /api/models/{repo}/tree/{commit}?recursive=True&expand=False` (list_repo_tree, paginated by a `Link`
   header): one JSON object per file, `type`, `path`, `size`, `oid` and `lfs` for large files.
3. `HEAD /{repo}/resolve/{commit}/{path}` per file: `X-Repo-Commit`, `ETag` (`X-Linked-Etag` and
   `X-Linked-Size` for LFS files), `Content-Length`. Errors carry `X-Error-Code` (GatedRepo, RepoNotFound, …).
4. `GET` of the same URL, with `Range: bytes=N-` when it resumes after a dropped connection (answer 206).

Every request is logged (method, path, headers, status, body bytes sent), so tests can assert on the exact
conversation. Faults are armed per file: drop the connection after N body bytes, or answer an error status.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from tests.scripted_server import POLL_S

LFS_THRESHOLD = 10 * 1024  # files above this are served as LFS files (sha256 ETag, X-Linked-Size)


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    sha: str = "0123456789abcdef0123456789abcdef01234567"
    gated: bool = False  # file downloads need `Authorization: Bearer <token>`

    def git_oid(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    def etag(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha256(data).hexdigest() if len(data) > LFS_THRESHOLD else self.git_oid(path)


@dataclass
class Logged:
    method: str
    path: str
    headers: dict[str, str]
    status: int = 0
    body_bytes: int = 0


@dataclass
class Fault:
    drop_after: int | None = None  # send the headers of the whole file, then this many bytes, then close
    status: int | None = None  # answer this status instead
    times: int = 1  # how many GETs the fault applies to


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo]
    token: str | None = None  # the token gated repos accept
    log: list[Logged] = field(default_factory=list)
    faults: dict[tuple[str, str], Fault] = field(default_factory=dict)  # (repo, path) → fault on GET
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, args=(POLL_S,), name="fake-hub",
                                        daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def record(self, entry: Logged) -> None:
        with self._lock:
            self.log.append(entry)

    def gets(self, path_suffix: str = "") -> list[Logged]:
        """File GETs (not API calls), optionally only those whose path ends with `path_suffix`."""
        return [e for e in self.log if e.method == "GET" and "/resolve/" in e.path and e.path.endswith(path_suffix)]

    def take_fault(self, repo: str, path: str) -> Fault | None:
        with self._lock:
            fault = self.faults.get((repo, path))
            if fault is None or fault.times <= 0:
                return None
            fault.times -= 1
            return fault


_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+)|/tree/(?P<tree>[^/]+))?/?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-$")


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self._serve(head=False)

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def _serve(self, head: bool) -> None:
            entry = Logged(self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
            hub.record(entry)
            path = unquote(urlsplit(self.path).path)
            api = _API.match(path)
            if api and not head:
                self._api(entry, api.group("repo"), api.group("tree"))
                return
            resolve = _RESOLVE.match(path)
            if resolve:
                self._file(entry, resolve.group("repo"), resolve.group("rev"), resolve.group("path"), head)
                return
            self._error(entry, 404, "EntryNotFound", "no such route", head)

        def _repo(self, entry: Logged, repo_id: str, head: bool) -> FakeRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                # The Hub answers 401 to an anonymous caller and 404 to an authenticated one.
                status = 404 if "authorization" in entry.headers else 401
                self._error(entry, status, "RepoNotFound", "Repository not found", head)
            return repo

        def _api(self, entry: Logged, repo_id: str, tree: str | None) -> None:
            repo = self._repo(entry, repo_id, head=False)
            if repo is None:
                return
            if tree is None:
                body = {"id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": False,
                        "gated": "manual" if repo.gated else False,
                        "siblings": [{"rfilename": p} for p in repo.files]}
            else:
                body = []
                for p, data in repo.files.items():
                    item = {"type": "file", "path": p, "size": len(data), "oid": repo.git_oid(p)}
                    if len(data) > LFS_THRESHOLD:
                        item["lfs"] = {"oid": repo.etag(p), "size": len(data), "pointerSize": 134}
                    body.append(item)
            self._send(entry, 200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head=False)

        def _file(self, entry: Logged, repo_id: str, rev: str, path: str, head: bool) -> None:
            repo = self._repo(entry, repo_id, head)
            if repo is None:
                return
            if rev not in (repo.sha, "main"):
                self._error(entry, 404, "RevisionNotFound", "Invalid rev id", head)
                return
            if repo.gated and entry.headers.get("authorization") != f"Bearer {hub.token}":
                self._error(entry, 401, "GatedRepo",
                            f"Access to model {repo_id} is restricted. You must have access to it and be "
                            "authenticated to access it. Please log in.", head)
                return
            if path not in repo.files:
                self._error(entry, 404, "EntryNotFound", f"{path} does not exist on \"main\"", head)
                return
            data = repo.files[path]
            etag = repo.etag(path)
            headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            if len(data) > LFS_THRESHOLD:
                headers |= {"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))}
            if head:
                self._send(entry, 200, data, headers, head=True)
                return
            fault = hub.take_fault(repo_id, path)
            if fault is not None and fault.status is not None:
                self._error(entry, fault.status, None, "injected failure", head=False)
                return
            start = 0
            status = 200
            match = _RANGE.match(entry.headers.get("range", ""))
            if match:
                start = int(match.group(1))
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            if fault is not None and fault.drop_after is not None:
                self._send_partial(entry, status, body, headers, fault.drop_after)
                return
            self._send(entry, status, body, headers, head=False)

        def _error(self, entry: Logged, status: int, code: str | None, message: str, head: bool) -> None:
            headers = {"X-Error-Message": message, "Content-Type": "application/json"}
            if code:
                headers["X-Error-Code"] = code
            self._send(entry, status, json.dumps({"error": message}).encode(), headers, head)

        def _headers(self, entry: Logged, status: int, headers: dict[str, str], length: int) -> None:
            entry.status = status
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(length))
            self.end_headers()

        def _send(self, entry: Logged, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
            self._headers(entry, status, headers, len(body))
            if not head:
                for piece in _chunks(body):
                    self.wfile.write(piece)
                    entry.body_bytes += len(piece)

        def _send_partial(self, entry: Logged, status: int, body: bytes, headers: dict[str, str],
                          limit: int) -> None:
            """Promise the whole body, send `limit` bytes, then close: the client sees a dropped connection."""
            self._headers(entry, status, headers, len(body))
            self.wfile.write(body[:limit])
            self.wfile.flush()
            entry.body_bytes += min(limit, len(body))
            self.close_connection = True

    return Handler


def _chunks(body: bytes, size: int = 256 * 1024) -> Iterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i:i + size]
