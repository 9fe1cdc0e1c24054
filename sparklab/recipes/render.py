"""Recipe → LaunchSpec: sandboxed Jinja (StrictUndefined) renders an argv list, never a shell string (pure).

Shell quoting happens only in `docker_command`, which prints a command a human can paste.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparklab import __version__
from sparklab.engines import caches as engine_cache
from sparklab.engines import engine as engine_adapter
from sparklab.errors import RecipeError
from sparklab.recipes import sandbox
from sparklab.recipes.schema import METHOD_ARGS_MARKER, EngineSpec, Recipe
from sparklab.spec import (
    API_KEY_PLACEHOLDER,
    PASSTHROUGH_ENV,
    LaunchSpec,
    Mount,
    endpoint_url,
    is_secret_name,
    session_labels,
)


@dataclass(frozen=True)
class LaunchOptions:
    """Choices made on the command line rather than in the recipe."""

    image: str | None = None
    port: int | None = None
    num_speculative_tokens: int | None = None
    public: bool = False
    api_key: bool = True
    hf_cache: Path = field(default_factory=lambda: Path("~/.cache/huggingface").expanduser())
    engine_cache_root: Path = field(default_factory=engine_cache.default_root)  # one directory per image digest
    gpus: bool | None = None
    extra_args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()  # KEY=VALUE, or KEY to pass the host's value through
    ulimits: tuple[str, ...] = ()  # NAME=SOFT[:HARD], overriding the recipe's
    run_id: str = ""
    mode: str = "up"
    ready_timeout_s: float | None = None
    # Another Docker host (sparklab.hosts): where the controller reaches its servers, and a network mode that
    # overrides the recipe's (a host whose daemon has no bridge runs them on the host network).
    address: str | None = None
    network: str | None = None


# Any: Jinja's context: the recipe's values, of any YAML type
def template_context(recipe: Recipe, engine: str, method: str, port: int) -> dict[str, Any]:
    model = recipe.model_of(engine)
    return {
        **recipe.vars,
        "model": model.id,
        "served_name": model.served_name or model.id,
        "drafts": {name: draft.id for name, draft in model.drafts.items()},
        "engine": engine,
        "method": method,
        "port": port,
    }


# Any: Jinja's context for `node`/`head` (placeholders until the hosts are chosen)
def placeholder_node(nodes: int, cluster_port: int | None) -> dict[str, Any]:
    """Template names of a multi-node recipe before its hosts are known."""
    head = {"rank": 0, "address": "<head cluster_address>", "interface": "<head interface>",
            "ib_hca": "<head ib_hca>"}
    return {"node": head, "head": head, "nodes": nodes, "cluster_port": cluster_port}


def _render_one(value: Any, context: dict[str, Any], where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if "{" not in text:
        return text
    return sandbox.render_template(text, context, where)


def _args(recipe: Recipe, engine_name: str, spec: EngineSpec, method: str,
          context: dict[str, Any]) -> list[str]:
    src = recipe.source
    method_args = [
        _render_one(v, context, f"{src}: engines.{engine_name}.methods.{method}.args[{i}]")
        for i, v in enumerate(spec.methods[method].args)
    ]
    out: list[str] = []
    for i, value in enumerate(spec.args):
        if value == METHOD_ARGS_MARKER:
            out.extend(method_args)
        else:
            out.append(_render_one(value, context, f"{src}: engines.{engine_name}.args[{i}]"))
    if METHOD_ARGS_MARKER not in spec.args:
        out.extend(method_args)
    return out


def _image(spec: EngineSpec, override: str | None) -> str:
    if override:
        return override
    return f"{spec.image.split('@')[0]}@{spec.digest}" if spec.digest else spec.image


def _env(spec: EngineSpec, method_env: dict[str, str], options: LaunchOptions, context: dict[str, Any],
         where: str) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """(plain env, names passed without printing their value, secret values given on the command line)."""
    env = {k: _render_one(v, context, f"{where}.env.{k}") for k, v in {**spec.env, **method_env}.items()}
    hidden: list[str] = [name for name in PASSTHROUGH_ENV if os.environ.get(name)]
    secret_values: dict[str, str] = {}
    for item in options.env:
        name, eq, value = item.partition("=")
        if not name or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise RecipeError(f"--env {item!r}: not a valid variable name",
                              "Use --env NAME=VALUE, or --env NAME to pass the host's value through.")
        if eq and not is_secret_name(name):
            env[name] = value
            continue
        hidden.append(name)  # the host's value at launch, or the secret given here; never printed
        env.pop(name, None)
        if eq:
            secret_values[name] = value
    return env, list(dict.fromkeys(hidden)), secret_values


# Any: `node` is Jinja's context for one node (recipes.multinode)
def render(recipe: Recipe, engine: str | None = None, method: str | None = None,
           options: LaunchOptions | None = None, node: dict[str, Any] | None = None) -> LaunchSpec:
    """The engine's server as the recipe describes it. A recipe with `nodes: N` renders its head's serve command
    here; `node` gives the templates `node` and `head` (sparklab.multinode passes each node's; without it they
    are placeholders, so a plan or a parser check can render the serve command before hosts are chosen)."""
    options = options or LaunchOptions()
    engine_name, spec = recipe.engine(engine)
    method = method or (recipe.default_method if recipe.default_method in spec.methods else next(iter(spec.methods)))
    if method not in spec.methods:
        raise RecipeError(
            f"{recipe.source}: engines.{engine_name}.methods: engine {engine_name!r} has no method {method!r}",
            f"Methods of {engine_name} in this recipe: {', '.join(spec.methods)}."
            + engine_adapter(spec.kind).method_hint(method))
    if options.num_speculative_tokens is not None:
        recipe = recipe.model_copy(update={"vars": {**recipe.vars,
                                                    "num_speculative_tokens": options.num_speculative_tokens}})
    port = spec.port if options.port is None else options.port
    if not 1 <= port <= 65535:
        raise RecipeError(f"port {port} is not a TCP port",
                          f"Give a port from 1 to 65535, or leave --port out for the recipe's {spec.port}.")
    context = template_context(recipe, engine_name, method, port)
    if spec.nodes > 1:
        context.update(node or placeholder_node(spec.nodes, spec.cluster_port))
    argv = _args(recipe, engine_name, spec, method, context)
    recipe_argv_len = len(argv)
    argv.extend(options.extra_args)

    known = engine_adapter(spec.kind)
    network = options.network or spec.network
    host = "0.0.0.0" if options.public or network == "bridge" else "127.0.0.1"
    argv.extend(known.network_args(host, port))
    if options.api_key:
        argv.extend(known.api_key_args(API_KEY_PLACEHOLDER))
    where = f"{recipe.source}: engines.{engine_name}"
    env, secret_env, secret_values = _env(spec, spec.methods[method].env, options, context, where)
    api_key_env = known.api_key_env if options.api_key else None
    if api_key_env:
        secret_env.append(api_key_env)

    gpus = spec.gpus == "all" if options.gpus is None else options.gpus
    process = spec.runtime == "process"  # a host program sees the host's files: nothing to mount
    mounts: tuple[Mount, ...] = ((Mount(str(options.hf_cache), spec.hf_cache_target),)
                                 if spec.mount_hf_cache and not process else ())
    entrypoint = _program(spec, context, where) if process else tuple(spec.entrypoint)
    image = entrypoint[0] if process else _image(spec, options.image)
    if spec.engine_cache and not process:  # the recipe's own env and --env win over the cache variables
        mounts += (Mount(engine_cache.source(options.engine_cache_root, image), engine_cache.TARGET),)
        env.update({k: v for k, v in known.cache_env(engine_cache.TARGET).items()
                    if k not in env and k not in secret_env})
    ulimits = {k: (v, v) if isinstance(v, int) else (v[0], v[1]) for k, v in spec.ulimits.items()}
    ulimits.update(_ulimit_overrides(options.ulimits))
    labels = {
        "sparklab": "1",
        "sparklab.version": __version__,
        "sparklab.run_id": options.run_id,
        "sparklab.recipe": recipe.name,
        "sparklab.engine": engine_name,
        "sparklab.kind": spec.kind,
        "sparklab.method": method,
        "sparklab.mode": options.mode,
        "sparklab.endpoint": endpoint_url(host, port, options.address),
        **session_labels(),
    }
    suffix = f"-{options.run_id}" if options.run_id else ""
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", f"sparklab-{recipe.name}-{engine_name}-{method}{suffix}")
    return LaunchSpec(
        recipe=recipe.name, recipe_path=recipe.source, engine=engine_name, kind=spec.kind, method=method,
        image=image,
        image_alternatives=() if options.image else tuple(spec.image_alternatives), platform=spec.platform,
        entrypoint=entrypoint,
        argv=tuple(argv), env=env, secret_env=tuple(secret_env), host=host, port=port, network=network,
        ipc=spec.ipc, shm_size=spec.shm_size, ulimits=ulimits, gpus=gpus, mounts=mounts, labels=labels,
        name=safe[:120], ready_path=known.ready_path,
        ready_timeout_s=options.ready_timeout_s or spec.ready_timeout_s,
        speculative=known.speculative(argv), recipe_argv_len=recipe_argv_len,
        needs_api_key=options.api_key, api_key_env=api_key_env, public=options.public, secret_values=secret_values,
        hf_cache=str(options.hf_cache) if spec.mount_hf_cache and not process else None,
        engine_cache=str(options.engine_cache_root) if spec.engine_cache and not process else None,
        runtime=spec.runtime, address=options.address,
    )


def _program(spec: EngineSpec, context: dict[str, Any], where: str) -> tuple[str, ...]:
    """A process engine's command: entrypoint[0] from VENV/bin when the recipe names a venv (paths expanded)."""
    head = [_render_one(v, context, f"{where}.entrypoint[{i}]") for i, v in enumerate(spec.entrypoint)]
    if spec.venv:
        venv = os.path.expanduser(_render_one(spec.venv, context, f"{where}.venv"))
        if "/" not in head[0]:
            head[0] = os.path.join(venv, "bin", head[0])
    head[0] = os.path.expanduser(head[0])
    return tuple(head)


def _ulimit_overrides(items: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for item in items:
        name, _, value = item.partition("=")
        soft, _, hard = value.partition(":")
        try:
            out[name] = (int(soft), int(hard or soft))
        except ValueError:
            raise RecipeError(f"--ulimit {item!r}: expected NAME=SOFT[:HARD] with integers",
                              "Example: --ulimit memlock=-1 --ulimit stack=67108864") from None
    return out


# ---------------------------------------------------------------------------------------------------
# Printing for humans


def _home(path: str) -> str:
    home = str(Path.home())
    return "~" + path[len(home):] if path == home or path.startswith(home + "/") else path


def _quote(arg: str) -> str:
    return '"$SPARKLAB_API_KEY"' if arg == API_KEY_PLACEHOLDER else shlex.quote(arg)


def _quote_opt(arg: str) -> str:
    """Quote a docker option; `~/…` stays unquoted so the shell expands it, the API key stays a variable."""
    if arg.endswith("=" + API_KEY_PLACEHOLDER):
        return arg.split("=", 1)[0] + '="$SPARKLAB_API_KEY"'
    if arg.startswith("~/"):
        return "~/" + shlex.quote(arg[2:])
    return shlex.quote(arg)


def serve_command(spec: LaunchSpec) -> str:
    """The server command as run inside the container, shell-quoted, secrets as variables."""
    return " ".join(_quote(a) for a in (*spec.entrypoint, *spec.argv))


def launch_command(spec: LaunchSpec, multiline: bool = True) -> str:
    """What a human pastes to start the same server: `docker run …`, or the host command line."""
    return process_command(spec, multiline) if spec.runtime == "process" else docker_command(spec, multiline)


def process_command(spec: LaunchSpec, multiline: bool = True) -> str:
    """A process engine's command line, paste-ready: the recipe's environment as assignments, then the argv.

    Secret variables are not written out: the engine gets the host's value (the API key: $SPARKLAB_API_KEY)."""
    assigns = [f"{name}={shlex.quote(value)}" for name, value in spec.env.items()]
    assigns += [f'{name}="$SPARKLAB_API_KEY"' for name in spec.secret_env if name == spec.api_key_env]
    head = " ".join([*assigns, _quote_opt(_home(spec.entrypoint[0])), *(_quote(a) for a in spec.entrypoint[1:])])
    groups = [" ".join(_quote(a) for a in group) for group in _flag_groups(list(spec.argv))]
    sep = " \\\n    " if multiline else " "
    return sep.join([head, *groups])


def docker_command(spec: LaunchSpec, multiline: bool = True, docker_host: str | None = None) -> str:
    """A `docker run` a human can paste: the same container sparklab would start (labels aside), on another
    Docker host with `docker -H URL` when docker_host names one."""
    opts: list[list[str]] = [["docker", *(("-H", docker_host) if docker_host else ()), "run", "--rm", "--init",
                              "--name", spec.name]]
    if spec.gpus:
        opts.append(["--gpus", "all"])
    if spec.ipc == "host":
        opts.append(["--ipc=host"])
    if spec.shm_size:
        opts.append([f"--shm-size={spec.shm_size}"])
    if spec.network == "host":
        opts.append(["--network=host"])
    else:
        bind = "" if spec.public else "127.0.0.1:"
        opts.append(["-p", f"{bind}{spec.port}:{spec.port}"])
    for name, (soft, hard) in spec.ulimits.items():
        opts.append(["--ulimit", f"{name}={soft}" if soft == hard else f"{name}={soft}:{hard}"])
    for mount in spec.mounts:
        suffix = "" if mount.mode == "rw" else f":{mount.mode}"
        opts.append(["-v", f"{_home(mount.source)}:{mount.target}{suffix}"])
    for name, value in spec.env.items():
        opts.append(["-e", f"{name}={value}"])
    for name in spec.secret_env:
        opts.append(["-e", f"{name}={API_KEY_PLACEHOLDER}" if name == spec.api_key_env else name])
    opts.append(["--entrypoint", spec.entrypoint[0], spec.image])
    quoted = [" ".join(_quote_opt(q) for q in group) for group in opts]
    quoted += [" ".join(_quote(a) for a in group) for group in _flag_groups([*spec.entrypoint[1:], *spec.argv])]
    sep = " \\\n    " if multiline else " "
    return sep.join(quoted)


def _flag_groups(argv: list[str]) -> list[list[str]]:
    """Split argv into a leading group and one group per flag with its values, for one flag per line."""
    groups: list[list[str]] = []
    for arg in argv:
        if not groups or (arg.startswith("-") and not _is_number(arg)):
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return groups


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
