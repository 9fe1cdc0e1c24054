"""How sparklab reaches a Docker host: a Docker context, `tcp://` with TLS, `unix://`, or `ssh://` through the ssh
binary, each asked for its API version within a deadline. Part of the Docker runtime (runtimes/containers.py, the
one door to Docker: no other module of the package imports this one).

ssh:// hosts use docker-py's shell-out to the ssh binary, bounded (sparklab.runtimes.deadlines): every ssh
started here has a connect timeout, ignores the terminal's signals, keeps its own error for the message, and is
ended when its client closes or sparklab exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
import weakref
from pathlib import Path
from typing import Any

import docker
import docker.constants
import docker.errors
import requests
from docker.tls import TLSConfig
from docker.transport import sshconn

from sparklab.errors import ContainerError
from sparklab.runtimes import deadlines, processes


def connect(url: str, tls_dir: str | None, timeout: int, answer_s: float) -> docker.DockerClient:
    """A client of another Docker host that answered within answer_s: `ssh://` through the ssh binary (so
    ~/.ssh/config applies, as for `docker -H`), `tcp://` with TLS from tls_dir or DOCKER_CERT_PATH, `unix://`, or a
    Docker context name. No answer in time is an error (and the ssh started for it is ended)."""
    tls: TLSConfig | None = None
    base_url = url
    if "://" not in url:
        from docker.context import ContextAPI

        context = ContextAPI.get_context(url)
        if context is None:
            raise ContainerError(f"no Docker context named {url!r}",
                                 "List them with `docker context ls`, or give the host as ssh:// or tcp://.")
        base_url, tls = context.Host or "", context.TLSConfig  # no Host: refused just below
        if not base_url:
            raise ContainerError(f"Docker context {url!r} names no Docker endpoint",
                                 "See `docker context inspect`.")
    elif url.startswith("tcp://"):
        tls = _tls_config(tls_dir or os.environ.get("DOCKER_CERT_PATH"))
    hint = ("Check that `docker -H " + url + " info` works from here (ssh key, ~/.ssh/config, TLS certificates, "
            "the daemon running there).")
    # The API version is asked under the deadline (docker-py would ask it unbounded while making the client).
    probe = _client(base_url, tls, timeout, docker.constants.MINIMUM_DOCKER_API_VERSION)
    try:
        version = deadlines.within(answer_s, lambda: str(probe.version(api_version=False)["ApiVersion"]),
                                   f"connect-{url}")
    except deadlines.NoAnswer:
        raise ContainerError(f"the Docker host {url} gave no answer within {answer_s:g} s", hint) from None
    except (docker.errors.DockerException, requests.RequestException, OSError, KeyError) as exc:
        text = _ssh_error(probe) or (str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc))
        raise ContainerError(f"cannot reach the Docker host {url}: {text}", hint) from None
    finally:
        probe.close()  # ends its ssh, answered or not
    client = _client(base_url, tls, timeout, version)
    client.sparklab_url = base_url  # type: ignore[attr-defined]  # a context's endpoint, for its address
    return client


class _SSHSocket(sshconn.SSHSocket):
    """docker-py's ssh shell-out (docker 7.2.0, docker/transport/sshconn.py:34-61: `ssh [-l USER] [-p PORT] -- HOST
    docker system dial-stdio`, SIGINT ignored in the child, no option of its own, so no connect timeout) with
    deadlines.SSH_OPTIONS, the terminal's SIGHUP ignored as well, and ssh's own error kept for the message (in a
    file: a pipe nobody reads could fill and stall it)."""

    errors: Any = None  # a binary temporary file with ssh's stderr

    def connect(self, **kwargs: Any) -> None:  # type: ignore[override]  # docker-py's own signature
        args = ["ssh", *deadlines.SSH_OPTIONS]
        if self.user:
            args += ["-l", self.user]
        if self.port:
            args += ["-p", self.port]
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "SSL_CERT_FILE")}  # as docker-py
        self.errors = tempfile.TemporaryFile()  # noqa: SIM115 - it lives as long as the connection (end, GC)
        self.proc = processes.start_helper([*args, "--", self.host, "docker system dial-stdio"], env, self.errors)
        _STARTED.add(self)

    def last_error(self) -> str:
        """ssh's last line on stderr ("Connection timed out during banner exchange"), if it wrote one."""
        if self.errors is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            self.errors.seek(0)
            lines = self.errors.read(65536).decode("utf-8", "replace").strip().splitlines()
            return lines[-1].strip() if lines else ""
        return ""

    def close(self) -> None:
        """docker-py's close (sshconn.py:90-95: two newlines to ssh's stdin, a flush, SIGTERM), but an ssh that
        already ended (its host's daemon stopped, so `docker system dial-stdio` exited) is no error: the flush's
        BrokenPipeError came out of urllib3's pool finalizer at exit as a traceback on the console. Its stdin is
        closed either way, so nothing is left to flush when the file is collected."""
        try:
            super().close()
        except OSError:  # BrokenPipeError: nobody reads ssh's stdin any more
            if self.proc is not None and self.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()  # its buffered newlines go with it (the flush fails once more)
            self.end()

    def end(self) -> None:
        """End the ssh process now (a check that ran out of time)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()


_STARTED: weakref.WeakSet[_SSHSocket] = weakref.WeakSet()  # every ssh this process started that may still run


@atexit.register
def _end_every_ssh() -> None:
    """At exit (Ctrl-C while a silent host was being reached, say), end the ssh processes still running: they
    ignore the terminal's signals, and one waiting for a silent host's banner would outlive sparklab by up to
    deadlines.SSH_CONNECT_S. The check's daemon thread is left behind; its ssh must not be."""
    for sock in list(_STARTED):
        sock.end()


class _SSHConnection(sshconn.SSHConnection):
    def __init__(self, adapter: _SSHAdapter, timeout: Any, host: str | None) -> None:  # as docker-py passes them
        super().__init__(None, timeout, host)  # docker-py passes None for the socket path
        self._adapter = adapter

    def connect(self) -> None:
        sock = _SSHSocket(str(self.ssh_host))
        sock.settimeout(self.timeout)
        self._adapter.opened(sock)
        sock.connect()
        self.sock = sock


class _SSHPool(sshconn.SSHConnectionPool):
    def __init__(self, adapter: _SSHAdapter) -> None:
        super().__init__(None, adapter.timeout, adapter.max_pool_size, adapter.ssh_host)
        self._adapter = adapter

    def _new_conn(self) -> _SSHConnection:  # type: ignore[override]  # docker-py's SSHConnection too
        return _SSHConnection(self._adapter, self.timeout, self.ssh_host)


class _SSHAdapter(sshconn.SSHHTTPAdapter):
    """The shell-out adapter with bounded ssh processes; closing it ends every ssh it started that still runs."""

    def __init__(self, base_url: str, timeout: int) -> None:
        super().__init__(base_url, timeout, shell_out=True)
        self._sockets: weakref.WeakSet[_SSHSocket] = weakref.WeakSet()
        self.last: _SSHSocket | None = None

    def opened(self, sock: _SSHSocket) -> None:
        self._sockets.add(sock)
        self.last = sock

    def get_connection(self, url: str | bytes, proxies: Any = None) -> _SSHPool:
        return _SSHPool(self)  # a pool per request, as docker-py's shell-out has it (sshconn.py:220-226)

    def close(self) -> None:
        super().close()
        for sock in list(self._sockets):
            sock.end()


def _client(base_url: str, tls: Any, timeout: int, version: str) -> docker.DockerClient:
    """A client that has not talked to the daemon yet (the version is given); ssh:// goes through _SSHAdapter."""
    client = docker.DockerClient(base_url=base_url, tls=tls, use_ssh_client=True, timeout=timeout, version=version)
    if base_url.startswith("ssh://"):
        client.api.mount("http+docker://ssh", _SSHAdapter(base_url, timeout))
    return client


def _ssh_error(client: docker.DockerClient) -> str:
    adapter = client.api.adapters.get("http+docker://ssh")
    last = adapter.last if isinstance(adapter, _SSHAdapter) else None
    return last.last_error() if last is not None else ""


def _tls_config(cert_dir: str | None) -> TLSConfig:
    """TLS with the client certificate and CA of a `docker --tlsverify` setup; none without a directory."""
    if not cert_dir:
        raise ContainerError("a tcp:// Docker host needs TLS certificates",
                             "Give the host `tls_dir:` (with ca.pem, cert.pem, key.pem) or set DOCKER_CERT_PATH; "
                             "an unencrypted tcp:// daemon gives root to anyone on the network.")
    base = Path(cert_dir).expanduser()
    missing = [n for n in ("ca.pem", "cert.pem", "key.pem") if not (base / n).is_file()]
    if missing:
        raise ContainerError(f"{base}: no {', '.join(missing)}", "Put the daemon's CA and your client certificate "
                             "there (see Docker's 'Protect the Docker daemon socket').")
    return TLSConfig(client_cert=(str(base / "cert.pem"), str(base / "key.pem")), ca_cert=str(base / "ca.pem"),
                     verify=True)
