"""Typed recipes: loading, strict validation and name resolution (pure; `--set` is recipes.overrides).

A recipe file describes one target (a model on some hardware) and, per engine, the image, the launch
argv template and the speculative methods. Every error names the file, the key path and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from sparklab.engines import ENGINES
from sparklab.errors import RecipeError
from sparklab.inputs import check_text, parse_yaml, read_utf8
from sparklab.recipes.overrides import apply_overrides, secret_value_error
from sparklab.recipes.validation import ONE_COUNT, ONE_VALUE, PER_CONCURRENCY, VALUES, explain_validation
from sparklab.spec import is_secret_name

METHOD_ARGS_MARKER = "$method_args"
Scalar = str | int | float | bool


# Sensible bounds: a value outside them is a typo or a unit mistake, not a benchmark.
MAX_CONCURRENCY = 4096
MAX_REQUESTS = 1_000_000
MAX_REPEATS = 1000
MAX_WARMUP = 10_000
MAX_TOKENS = 2_097_152  # output tokens per request (2 Mi)
MAX_SPECULATIVE_TOKENS = 64
MAX_DURATION_S = 7 * 24 * 3600
MAX_TEMPERATURE = 100.0  # sampling temperature; top_p is in (0, 1]

# Whole numbers are strict: 4.0, 1.0e+29, true and "4" are errors, not silently converted.
Port = Annotated[int, Field(strict=True, ge=1, le=65535)]
Concurrency = Annotated[int, Field(strict=True, ge=1, le=MAX_CONCURRENCY)]
RequestCount = Annotated[int, Field(strict=True, ge=1, le=MAX_REQUESTS)]
TokenCount = Annotated[int, Field(strict=True, ge=1, le=MAX_TOKENS)]
SpeculativeTokens = Annotated[int, Field(strict=True, ge=1, le=MAX_SPECULATIVE_TOKENS)]
Seconds = Annotated[float, Field(gt=0, le=MAX_DURATION_S, allow_inf_nan=False)]

# Union members are told apart by shape (their tags, validation.UNION_TAGS, are left out of error locations).


# Any: YAML before pydantic validates it
def one_or_list(value: Any) -> str:
    """The tag of a value that may be given alone or as a list of values (a sweep axis)."""
    return VALUES if isinstance(value, list) else ONE_VALUE
RequestsSpec = Annotated[
    Annotated[RequestCount, Tag(ONE_COUNT)] | Annotated[dict[Concurrency, RequestCount], Tag(PER_CONCURRENCY)],
    Discriminator(lambda v: PER_CONCURRENCY if isinstance(v, dict) else ONE_COUNT),
]


def _registered_kind(kind: Any) -> Any:
    """An engine kind is a registered adapter's (sparklab.engines.ENGINES); the error reads as a Literal's would."""
    if isinstance(kind, str) and kind in ENGINES:
        return kind
    known = [repr(k) for k in ENGINES]
    expected = " or ".join(filter(None, (", ".join(known[:-1]), known[-1])))
    raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})


EngineKind = Annotated[str, BeforeValidator(_registered_kind)]


def _default_ulimits() -> dict[str, int | tuple[int, int]]:
    """A recipe's ulimits when it gives none (a fresh dict each time: a model's defaults are not shared)."""
    return {"memlock": -1, "stack": 67108864}


class Strict(BaseModel):
    """Frozen, and unknown keys are errors (recipes and sweep files alike)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class DraftModel(Strict):
    id: str
    block_size: SpeculativeTokens | None = Field(
        default=None,
        description="the draft's dspark_block_size when known: vLLM refuses num_speculative_tokens below it",
    )


class ModelFacts(Strict):
    """Facts for the bandwidth roofline in reports; all optional (a report says what it had to leave out)."""

    total_params_b: float | None = Field(default=None, gt=0)
    active_params_b: float | None = Field(default=None, gt=0, description="parameters read per decode step")
    weight_bits: float | None = Field(default=None, gt=0, description="stored width of those weights")
    weight_format: Literal["nvfp4", "mxfp4", "fp8", "bf16", "fp16", "fp32"] | None = Field(
        default=None, description="the weights' format, counted at its real bits with its block scales (NVFP4: 4.5) "
                                  "when weight_bits is not given")
    # A mixture-of-experts target, from its config.json: a verify step through T tokens reads, per MoE layer, the
    # union of the experts they route to, experts x (1 - (1 - experts_per_token / experts)^T) (report roofline).
    moe_layers: int | None = Field(default=None, ge=1)
    experts: int | None = Field(default=None, ge=1, description="routed experts per MoE layer (n_routed_experts)")
    experts_per_token: int | None = Field(default=None, ge=1, description="num_experts_per_tok")
    expert_params_m: float | None = Field(default=None, gt=0, description="parameters of one routed expert, millions")
    layers: int | None = Field(default=None, ge=1)
    attention_layers: int | None = Field(default=None, ge=0)
    kv_bytes_per_token: float | None = Field(
        default=None, ge=0, description="KV cache bytes per token of context, all attention layers, K and V")
    state_bytes_per_seq: float | None = Field(
        default=None, ge=0, description="recurrent (Mamba/SSM) state bytes read per sequence per step")


class Hardware(Strict):
    """A device in recipes/hardware.yaml: its memory bandwidth bounds decode speed (the report's roofline)."""

    description: str = ""
    memory_gib: float | None = Field(default=None, gt=0)
    bandwidth_gbps: float = Field(gt=0, description="memory bandwidth, GB/s (10^9 bytes per second), nominal")
    usable_bandwidth_gbps: float | None = Field(
        default=None, gt=0, description="what a saturating read reaches (the roofline uses it, the nominal beside it)")
    usable_source: str | None = None
    arch: str | None = None
    # Unified memory as the kernel counts it (MemTotal, GiB), and what an idle host of this kind uses before
    # any server (MemTotal - MemAvailable): the model of the host where nothing can be measured (a plan made
    # elsewhere, the tests); a sweep measures its own baseline at its start.
    mem_total_gib: float | None = Field(default=None, gt=0)
    os_baseline_gib: float | None = Field(default=None, ge=0)
    twin: dict[str, Any] | None = None  # the rehearsal's host model; recipes/twin.py validates it


TWIN_ONLY = {"twin"}  # kept out of the facts a run stores (the report does not read it)


class ModelSpec(Strict):
    id: str
    served_name: str | None = None
    drafts: dict[str, DraftModel] = Field(default_factory=dict)
    facts: ModelFacts = Field(default_factory=ModelFacts)


class Method(Strict):
    description: str = ""
    args: list[Scalar] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class EngineSpec(Strict):
    kind: EngineKind
    # container: a Docker image (sparklab/containers.py); process: a program on this host run in its own process
    # group (sparklab/processes.py), e.g. from a venv, with the same guarantees.
    runtime: Literal["container", "process"] = "container"
    venv: str | None = Field(default=None, description="process runtime: entrypoint[0] is looked up in VENV/bin")
    image: str = ""
    image_alternatives: list[str] = Field(default_factory=list)
    digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    platform: str | None = Field(default=None, pattern=r"^linux/(amd64|arm64)$")
    entrypoint: list[str] = Field(min_length=1)
    port: Port
    args: list[Scalar] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    gpus: Literal["all", "none"] = "all"
    network: Literal["host", "bridge"] = "host"
    ipc: Literal["host", "private"] = "host"
    shm_size: str | None = None
    ulimits: dict[str, int | tuple[int, int]] = Field(default_factory=_default_ulimits)
    hf_cache_target: str = "/root/.cache/huggingface"
    mount_hf_cache: bool = True
    # Mount sparklab's per-image cache for torch.compile, Triton, FlashInfer, … (sparklab/engine_cache.py).
    engine_cache: bool = True
    ready_timeout_s: Seconds = 1800
    # This engine's own copy of the model (llama.cpp serves a GGUF, vLLM the safetensors): replaces the
    # recipe's `model` for it, in templates, pulls and the report's roofline facts.
    model: ModelSpec | None = None
    methods: dict[str, Method] = Field(min_length=1)
    # One server across several Docker hosts (sparklab.multinode): rank 0 (the head) serves HTTP, the others
    # join it on cluster_port (Ray's GCS for vLLM, torch.distributed's store for SGLang's --dist-init-addr).
    nodes: int = Field(default=1, strict=True, ge=1, le=8)
    cluster_port: Port | None = None

    @model_validator(mode="after")
    def _cluster(self) -> EngineSpec:
        if self.nodes == 1:
            return self
        if not ENGINES[self.kind].multinode:
            able = ", ".join(kind for kind, adapter in ENGINES.items() if adapter.multinode)
            raise ValueError(f"nodes: {self.nodes} needs an engine with a multi-node mode ({able}), not {self.kind}")
        if self.cluster_port is None:
            raise ValueError("nodes > 1 needs cluster_port (the head's port the other nodes join on, e.g. 6379)")
        if self.runtime != "container" or self.network != "host":
            raise ValueError("nodes > 1 runs containers on the host network (NCCL and Ray open many ports); "
                             "set runtime: container and network: host")
        return self

    @field_validator("args")
    @classmethod
    def _one_marker(cls, args: list[Scalar]) -> list[Scalar]:
        if args.count(METHOD_ARGS_MARKER) > 1:
            raise ValueError(f"{METHOD_ARGS_MARKER} may appear at most once")
        return args


class Recipe(Strict):
    name: str
    description: str = ""
    hardware: str | None = None
    unified_memory: bool = False
    min_available_gib: float | None = Field(default=None, ge=0)
    model: ModelSpec
    vars: dict[str, Any] = Field(default_factory=dict)
    default_engine: str
    default_method: str
    engines: dict[str, EngineSpec] = Field(min_length=1)

    # Where it came from, for error messages; not part of the file.
    source: str = Field(default="<memory>", exclude=True)

    def model_of(self, engine: str | None) -> ModelSpec:
        """The model an engine serves: its own `engines.NAME.model`, else the recipe's."""
        spec = self.engines.get(engine) if engine else None
        return spec.model if spec is not None and spec.model is not None else self.model

    def engine(self, name: str | None) -> tuple[str, EngineSpec]:
        key = name or self.default_engine
        if key not in self.engines:
            raise RecipeError(
                f"{self.source}: engines: no engine {key!r} in recipe {self.name!r}",
                f"Choose one of: {', '.join(self.engines)} (--engine NAME).")
        return key, self.engines[key]


# ---------------------------------------------------------------------------------------------------
# Loading and validation


# Any: YAML as loaded, before pydantic validates it
def parse_recipe(data: Any, source: str) -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        recipe = Recipe.model_validate({**data, "source": source})
    except ValidationError as exc:
        raise explain_validation(exc, source) from None
    _check_references(recipe)
    return recipe


def _check_runtime(src: str, name: str, spec: EngineSpec) -> None:
    """A container engine needs an image; a process engine runs a program on this host and has none."""
    where = f"{src}: engines.{name}"
    if spec.runtime == "container":
        if not spec.image:
            raise RecipeError(f"{where}.image: missing; a container engine needs an image",
                              "Give image: REPO:TAG, or runtime: process with venv/entrypoint for a host program.")
        if spec.venv:
            raise RecipeError(f"{where}.venv: only a process engine runs from a venv",
                              "Add runtime: process, or remove venv.")
        return
    if spec.image or spec.digest or spec.image_alternatives:
        raise RecipeError(f"{where}.image: a process engine (runtime: process) runs no image",
                          "Remove image/digest/image_alternatives, or use runtime: container.")


def _check_references(recipe: Recipe) -> None:
    src = recipe.source
    for name, spec in recipe.engines.items():
        _check_runtime(src, name, spec)
        envs = [(f"engines.{name}.env", spec.env)] + [(f"engines.{name}.methods.{m}.env", method.env)
                                                      for m, method in spec.methods.items()]
        for where, env in envs:
            for var in env:
                if is_secret_name(var):
                    raise secret_value_error(f"{src}: {where}.{var}", var)
    if recipe.default_engine not in recipe.engines:
        raise RecipeError(f"{src}: default_engine: {recipe.default_engine!r} is not under engines",
                          f"Use one of: {', '.join(recipe.engines)}.")
    default = recipe.engines[recipe.default_engine]
    if recipe.default_method not in default.methods:
        raise RecipeError(
            f"{src}: default_method: {recipe.default_method!r} is not a method of engine "
            f"{recipe.default_engine!r}", f"Use one of: {', '.join(default.methods)}.")


# Any: YAML as loaded, before pydantic validates it
def read_yaml(path: Path) -> Any:
    try:
        text = read_utf8(path)
    except FileNotFoundError:
        raise RecipeError(f"{path}: no such recipe file", "Check the path, or run `sparklab recipes`.") from None
    except OSError as exc:  # a directory, no permission
        raise RecipeError(f"{path}: cannot read it: {exc.strerror}", "Give the path of a YAML file.") from None
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise RecipeError(f"{path}:{where}: not valid YAML: {problem}",
                          "Fix the YAML syntax (indentation, quoting, a missing colon).") from None
    check_text(data, str(path))  # a lone \ud800 escape would fail only when it is sent
    return data


def load_recipe(path: Path, overrides: list[str] | None = None, origin: str = "--set") -> Recipe:
    """The recipe file with its overrides (origin: where they were written, for the errors), validated."""
    path = display_path(path)
    data = read_yaml(path)
    if overrides:
        data = apply_overrides(data, overrides, str(path), Recipe.model_fields, origin)
    return parse_recipe(data, str(path))


# ---------------------------------------------------------------------------------------------------
# Finding recipes by name


def recipes_dir() -> Path:
    env = os.environ.get("SPARKLAB_RECIPES")
    if env:
        return Path(env)
    bundled = Path(__file__).resolve().parents[2] / "recipes"
    return bundled if bundled.is_dir() else Path.cwd() / "recipes"


def load_hardware(directory: Path | None = None) -> dict[str, Hardware]:
    """The device table (recipes/hardware.yaml); empty when the file is absent."""
    path = (directory or recipes_dir()) / "hardware.yaml"
    if not path.is_file():
        return {}
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: expected a mapping of device name to its facts",
                          "Example: gb10: {bandwidth_gbps: 273, memory_gib: 128}")
    try:
        return TypeAdapter(dict[str, Hardware]).validate_python(data)
    except ValidationError as exc:
        raise explain_validation(exc, str(path)) from None


# Any: JSON, stored with the run
def stored_facts(recipe: Recipe, devices: dict[str, Hardware], engine: str | None = None) -> dict[str, Any]:
    """What a report needs years later without the recipe files: the facts of the model the engine serves, and
    the device."""
    device = devices.get(recipe.hardware) if recipe.hardware else None
    model = recipe.model_of(engine)
    return {"model": {"id": model.id, "facts": model.facts.model_dump(exclude_none=True)},
            "hardware": {"name": recipe.hardware, **device.model_dump(exclude_none=True, exclude=TWIN_ONLY)}
            if device else None}


def list_recipes(directory: Path | None = None) -> list[Path]:
    return sorted(p for p in (directory or recipes_dir()).glob("*.yaml") if p.name != "hardware.yaml")


def display_path(path: Path) -> Path:
    """A recipe path as a user would type it: relative to the working directory when inside it."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def resolve(spec: str, target: str | None = None, directory: Path | None = None) -> tuple[Path, str | None]:
    """Turn `sparklab up SPEC` into (recipe file, method or None for the recipe's default).

    SPEC is a method of the target recipe (`dspark`), a recipe name (`gb10-modelcard`), `recipe:method`,
    or a path to a YAML file (optionally `path.yaml:method`).
    """
    directory = directory or recipes_dir()
    base, _, method = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    if base.endswith((".yaml", ".yml")) or os.sep in base:
        return Path(base), method or None
    if method or (directory / f"{base}.yaml").is_file():
        path = directory / f"{base}.yaml"
        if not path.is_file():
            raise RecipeError(f"no recipe named {base!r} in {directory}", _available(directory))
        return path, method or None
    path = directory / f"{target or 'gb10'}.yaml"
    if not path.is_file():
        raise RecipeError(f"no recipe named {target or 'gb10'!r} in {directory}", _available(directory))
    return path, base


def _available(directory: Path) -> str:
    names = ", ".join(p.stem for p in list_recipes(directory)) or "(none)"
    return f"Available recipes: {names}."
