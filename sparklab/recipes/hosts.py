"""Docker hosts a sweep spreads its servers over, named the way Docker names engines (pure).

`local` is this machine's engine (DOCKER_HOST or the socket); `ssh://user@spark-2[:port]` goes through the
`ssh` binary (docker-py's `use_ssh_client`, so ~/.ssh/config, keys and agents work as for `docker -H`);
`tcp://spark-2:2376` speaks TLS with the certificates in `tls_dir` (or DOCKER_CERT_PATH); any other word is a
Docker context (`docker context create spark-2 --docker host=ssh://…`).

A host that serves one half of a two-node server (sparklab.multinode) also names its side of the link between
the Sparks: `cluster_address` (its IP on the ConnectX-7 link, what the other node and NCCL connect to),
`interface` (the netdev on that link, for NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME / UCX_NET_DEVICES) and
`ib_hca` (the RDMA device on it, for NCCL_IB_HCA; `ibdev2netdev` lists both). On the command line they follow
the Docker host after commas: `--host ssh://me@spark-2,cluster_address=192.168.100.11,interface=enp1s0f0np0`.

Each host gets its own port range: servers on a host listen on the recipe's port plus the host's
`port_offset`. Hosts that share an address (two daemons on one machine, as in the tests) get distinct offsets
(100 apart) unless the file gives them, so their servers never collide.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import SplitResult, urlsplit

from pydantic import Field, ValidationError

from sparklab.errors import RecipeError
from sparklab.recipes.schema import Strict

LOCAL_NAME = "local"
_CONTEXT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_AUTO_OFFSET = 100
LOOPBACK = ("127.0.0.1", "localhost", "::1")
_NET_NAME = r"^[A-Za-z0-9_.:^,=-]+$"  # an address, interface or HCA name (ends up in a container's env)
_EXTRAS = ("cluster_address", "interface", "ib_hca", "name", "address", "hf_cache")


class HostEntry(Strict):
    """One item of a sweep file's `hosts:` (a plain string is `{docker: STRING}`)."""

    docker: str = Field(min_length=1)
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:@-]+$")
    address: str | None = None  # where the controller reaches the host's servers (default: the URL's host)
    port_offset: int | None = Field(default=None, ge=0, le=60000)
    network: Literal["host", "bridge"] | None = None  # override the recipe's (a daemon without a bridge: host)
    tls_dir: str | None = None  # ca.pem, cert.pem, key.pem for tcp://
    hf_cache: str | None = None  # the Hugging Face cache on that host (default: the same path as here)
    # Its side of the link to the other Spark, for a server across two hosts (default: address).
    cluster_address: str | None = Field(default=None, pattern=_NET_NAME)
    interface: str | None = Field(default=None, pattern=_NET_NAME)  # the netdev on that link
    ib_hca: str | None = Field(default=None, pattern=_NET_NAME)  # the RDMA device on it (NCCL_IB_HCA)


@dataclass(frozen=True)
class Host:
    name: str
    docker: str  # "local", a URL, or a Docker context name
    address: str | None  # None: this machine
    port_offset: int = 0
    network: str | None = None
    tls_dir: str | None = None
    hf_cache: str | None = None
    cluster_address: str | None = None
    interface: str | None = None
    ib_hca: str | None = None

    @property
    def local(self) -> bool:
        return self.docker == LOCAL_NAME

    @property
    def remote_address(self) -> bool:
        """Its servers must listen on every interface (the controller reaches them over the network)."""
        return self.address is not None and self.address not in LOOPBACK


LOCAL = Host(LOCAL_NAME, LOCAL_NAME, None)


def _scheme(url: str) -> str:
    if url == LOCAL_NAME:
        return "local"
    if "://" in url:
        return url.split("://", 1)[0].lower()  # urlsplit would raise on a bad host part: _split words that
    return "context" if _CONTEXT.match(url) else "bad"


def _split(url: str, where: str) -> SplitResult:
    """The URL's parts, its port read once so that a bad one is an error here, not a ValueError later."""
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", a port that is not a number
        raise RecipeError(f"{where}: {url!r} is not a Docker host URL ({exc})",
                          "Write ssh://user@spark-2[:port], ssh://user@[fe80::1]:22 or tcp://spark-2:2376 "
                          "(ports 1-65535).") from None
    return parts


def parse_hosts(entries: Sequence[str | HostEntry], where: str) -> list[Host]:
    """Hosts in order, with names, addresses and port offsets settled; bad entries are errors naming `where`."""
    hosts: list[Host] = []
    for i, raw in enumerate(entries):
        entry = raw if isinstance(raw, HostEntry) else _from_text(str(raw), f"{where}: hosts[{i}]")
        scheme = _scheme(entry.docker)
        if scheme not in ("local", "ssh", "tcp", "unix", "context"):
            raise RecipeError(
                f"{where}: hosts[{i}]: {entry.docker!r} is not a Docker host",
                "Name it as Docker does: local, ssh://user@host[:port], tcp://host:2376 (TLS), unix:///path or "
                "a context name from `docker context ls`.")
        parts = _split(entry.docker, f"{where}: hosts[{i}]") if scheme in ("ssh", "tcp") else None
        if parts is not None and not parts.hostname:
            raise RecipeError(f"{where}: hosts[{i}]: {entry.docker!r} names no host",
                              "Write ssh://user@spark-2 or tcp://spark-2:2376.")
        address = entry.address or (parts.hostname if parts else None)
        if scheme == "local":
            name = entry.name or LOCAL_NAME
        elif parts is not None:
            name = entry.name or (f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname))
        else:
            name = entry.name or entry.docker.rsplit("/", 1)[-1]
        if any(h.name == name for h in hosts):
            raise RecipeError(f"{where}: hosts[{i}]: a second host named {name!r}",
                              "Give each host its own `name:` (or list each Docker host once).")
        hosts.append(Host(name, entry.docker if scheme != "local" else LOCAL_NAME, address,
                          entry.port_offset if entry.port_offset is not None else -1, entry.network, entry.tls_dir,
                          entry.hf_cache, entry.cluster_address, entry.interface, entry.ib_hca))
    return _settle_offsets(hosts, where)


def entry_of(text: str, where: str) -> HostEntry:
    """A `--host` value as the hosts: entry it stands for (what a tune writes into its space file)."""
    return _from_text(text, where)


def _from_text(text: str, where: str) -> HostEntry:
    """`DOCKER[,key=value...]`: a Docker host, then what the command line may say of it."""
    docker, *pairs = text.split(",")
    extras: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or key not in _EXTRAS or not value:
            raise RecipeError(f"{where}: {pair!r} in {text!r} is not KEY=VALUE with a key of {', '.join(_EXTRAS)}",
                              "Example: ssh://me@spark-2,cluster_address=192.168.100.11,interface=enp1s0f0np0")
        extras[key] = value
    try:
        return HostEntry(docker=docker, **extras)
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise RecipeError(f"{where}: {text!r}: {wrong}",
                          "Addresses, interface and HCA names are letters, digits and . : _ -") from None


def _settle_offsets(hosts: list[Host], where: str) -> list[Host]:
    """Hosts on one address share its ports: each gets its own range (given, or 100 apart)."""
    settled: list[Host] = []
    for host in hosts:  # a context's address is known once it is read (fleet.connect): give it port_offset
        same = [h for h in settled if _where(h) == _where(host) and _where(h) is not None]
        taken = {h.port_offset for h in same}
        offset = host.port_offset
        if offset < 0:
            offset = 0
            while offset in taken:
                offset += _AUTO_OFFSET
        elif offset in taken:
            raise RecipeError(f"{where}: hosts: {host.name} and another host on {host.address or 'this machine'} "
                              f"both use port_offset {offset}",
                              "Give hosts that share an address different port_offset values.")
        settled.append(dataclasses.replace(host, port_offset=offset))
    return settled


def _where(host: Host) -> str | None:
    if host.address:
        return host.address
    return "127.0.0.1" if host.local or host.docker.startswith("unix://") else None


def with_address(host: Host, url: str) -> Host:
    """A context's host once its Docker endpoint is known (unix://: this machine)."""
    if host.address is not None or "://" not in url or url.startswith("unix://"):
        return host
    return dataclasses.replace(host, address=urlsplit(url).hostname)


def redact_url(url: str) -> str:
    """A host URL as it may be printed or stored: a password in it (ssh://user:pw@host) becomes ***."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
