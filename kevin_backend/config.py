"""Configuration: the one registry of environment variables and the typed `Config`.

Every environment variable the project reads is declared in `ENV` below, with its type, default
and meaning; nothing else in the package calls `os.environ`. Values are read lazily (when a
`Config` is built), so setting a variable after import still takes effect.

A `Config` is built from the environment and then from `torch.compile(..., options={...})`;
options win over the environment. `override(...)` patches the environment-derived defaults for a
block of code (tests use it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["ENV", "EnvVar", "Mode", "Config", "ConfigError", "AUTO_POLICY", "OP_SUPPORTS", "POLICY_FORMS", "POLICY_NAMES", "PolicyForm",
           "build_root", "cache_dir_of", "check_policy_name", "policy_form", "child_env", "override", "env_value"]


class ConfigError(ValueError):
    """A configuration value or option is invalid; the message names it."""


class Mode(str, Enum):
    """What the backend does with each partition of a graph."""

    CACHE = "cache"  # use cached winners; record misses as pending tasks; Inductor runs the rest
    GENERATE = "generate"  # on a miss, run the kernel generator before compiling
    OFF = "off"  # pure Inductor: no partitioning at all

    @classmethod
    def _missing_(cls, value: object) -> "Mode":
        # Enum's own error ("'fast' is not a valid Mode") leaves the valid names out
        raise ValueError(f"{value!r} is not a valid mode; valid modes: {', '.join(m.value for m in cls)}")


# The grammar of policy names (KEVIN_POLICY, option `policy`, --policy), as data: the writer
# registry (`generate/writers.py`) makes a policy for each form, and a Config built with a name
# none of them reads fails at once, without importing, loading or contacting anything.
AUTO_POLICY: str = "auto"  # a model server when one is configured, else the built-in writer


@dataclass(frozen=True)
class PolicyForm:
    """One form of a policy name: `kind`, `kind[:ARG]` (the argument optional) or `kind:ARG`."""

    kind: str
    arg: str = ""  # what follows the colon, as the usage names it (MODEL, PATH, FILE); "" for nothing
    required: bool = False  # the name must carry its argument
    names: str = ""  # what a required argument names, for the message when it is missing

    @property
    def usage(self) -> str:
        if not self.arg:
            return self.kind
        return f"{self.kind}:{self.arg}" if self.required else f"{self.kind}[:{self.arg}]"


POLICY_FORMS: tuple[PolicyForm, ...] = (
    PolicyForm("builtin"),
    PolicyForm("openai", "MODEL"),
    PolicyForm("vllm", "MODEL"),
    PolicyForm("hf", "PATH", required=True, names="model folder"),
    PolicyForm("replay", "FILE", required=True, names="replies file"),
)
_USAGES = (AUTO_POLICY, *(form.usage for form in POLICY_FORMS))
POLICY_NAMES: str = ", ".join(_USAGES[:-1]) + " or " + _USAGES[-1]


# The op declarations the `writer` setting can name (the registry's OP_SUPPORT_FACTORIES makes
# them); `auto` takes the configured policy's writer's.
OP_SUPPORTS: tuple[str, ...] = ("general", "builtin")


def _form_of_kind(spec: str) -> PolicyForm | None:
    """The form whose kind `spec` starts with, its argument not looked at."""
    kind = spec.partition(":")[0]
    return next((f for f in POLICY_FORMS if f.kind == kind), None)


def policy_form(spec: str) -> PolicyForm | None:
    """The form `spec` is written in (None for `auto` and for a name of no form). Only the name is
    read: nothing is imported, loaded or contacted."""
    form = _form_of_kind(spec)
    return form if form is not None and (not form.required or spec.partition(":")[2].strip()) else None


def check_policy_name(spec: str) -> str:
    """`spec` if it names a policy the writer registry can make, else a ConfigError naming it and
    the valid names."""
    if spec == AUTO_POLICY or policy_form(spec) is not None:
        return spec
    form = _form_of_kind(spec)
    if form is not None:  # a required argument missing
        raise ConfigError(f"policy {spec!r} names no {form.names}: use {form.usage}; valid policies: {POLICY_NAMES}")
    raise ConfigError(f"unknown policy {spec!r}; valid policies: {POLICY_NAMES}")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


@dataclass(frozen=True)
class EnvVar:
    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str


def _default_cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "kevin_backend"


ENV: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar("KEVIN_MODE", Mode, Mode.CACHE, "cache | generate | off"),
        EnvVar("KEVIN_CACHE_DIR", Path, None, "user kernel cache (default ~/.cache/kevin_backend)"),
        EnvVar("KEVIN_SEED_CACHE", _parse_bool, True, "consult the seed cache shipped with the package"),
        EnvVar("KEVIN_LLM_URL", str, "http://localhost:8000/v1", "OpenAI-compatible server base URL"),
        EnvVar("KEVIN_MODEL", str, "cognition-ai/Kevin-32B", "model name on that server"),
        EnvVar("KEVIN_LLM_API_KEY", str, None, "API key for that server, sent as a bearer token (optional)"),
        EnvVar("KEVIN_LLM_TIMEOUT", float, 1800.0, "seconds one request to that server may take"),
        EnvVar("KEVIN_LLM_CONCURRENCY", int, 32, "most requests of one batch in flight at once"),
        EnvVar("KEVIN_POLICY", str, AUTO_POLICY, f"kernel writer in generate mode: {', '.join(_USAGES)} (auto: openai when KEVIN_LLM_URL or KEVIN_MODEL is set, else builtin)"),
        EnvVar("KEVIN_WRITER", str, "auto", f"which writer's op declarations cut the graph: auto, {', '.join(OP_SUPPORTS)} (auto: builtin when the policy is the built-in writer and no generator is given)"),
        EnvVar("KEVIN_TRAJECTORIES", int, 16, "parallel trajectories per generated task"),
        EnvVar("KEVIN_TURNS", int, 8, "refinement turns per trajectory"),
        EnvVar("KEVIN_BEAM", int, 0, "keep the best k trajectories after each turn (0: no beam)"),
        EnvVar("KEVIN_MARGIN", float, 0.03, "a kernel is kept when the lower confidence bound of Inductor's time over its own exceeds 1 + this (negative values keep slower kernels: for testing the pipeline)"),
        EnvVar("KEVIN_ROOFLINE_STOP", float, 0.9, "a trajectory stops once its best correct kernel reaches this fraction of the GPU's measured copy bandwidth (0: never)"),
        EnvVar("KEVIN_GRAPH_CHECK", _parse_bool, True, "time each compiled graph with and without its kernels (interleaved, with the noise counted) and keep only the kernels that make the graph faster; the outcome is stored in the cache"),
        EnvVar("KEVIN_MIN_PARTITION", int, 2, "fewest compute nodes in a partition (a reduction counts two)"),
        EnvVar("KEVIN_MAX_PARTITION", int, 64, "most compute nodes in a partition"),
        EnvVar("KEVIN_RECORD_PENDING", _parse_bool, True, "record cache misses as pending tasks"),
        EnvVar("KEVIN_CPU_KERNELS", _parse_bool, False, "use cached kernels for CPU tensors (pipeline tests)"),
        EnvVar("KEVIN_LOG", str, "WARNING", "log level of the kevin_backend logger"),
        EnvVar("KEVIN_CUTLASS_INCLUDE", str, None, "the folder holding CUTLASS's cutlass/ and cute/ headers (default: the installed nvidia-cutlass package's)"),
    )
}

_overrides: dict[str, Any] = {}


def env_value(name: str) -> Any:
    """The typed value of a registered environment variable (override, then environment, then default)."""
    var = ENV[name]
    if name in _overrides:
        return _overrides[name]
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return _default_cache_dir() if name == "KEVIN_CACHE_DIR" and var.default is None else var.default
    try:
        return var.parse(raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"environment variable {name}={raw!r} is invalid ({var.doc}): {exc}") from exc


def env_is_set(name: str) -> bool:
    """Whether a registered variable was given (an override, or a non-empty environment value)."""
    if name not in ENV:
        raise ConfigError(f"unknown setting {name!r}")
    return name in _overrides or bool(os.environ.get(name))


def cuda_toolkit_dirs() -> tuple[str | None, str | None]:
    """The CUDA toolkit folders the environment names ($CUDA_HOME, $CUDA_PATH), as the CUDA
    tools themselves read them (not kevin settings)."""
    return os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")


def child_env(**overrides: str) -> dict[str, str]:
    """The environment for a worker process: this process's, with `overrides` set (for the tools
    the worker runs, e.g. TORCH_CUDA_ARCH_LIST for torch's extension builder)."""
    return {**os.environ, **overrides}


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Patch environment-derived values for a block: `with override(KEVIN_MODE="off"): ...`."""
    unknown = set(values) - set(ENV)
    if unknown:
        raise ConfigError(f"unknown setting(s): {sorted(unknown)}; known: {sorted(ENV)}")
    saved = dict(_overrides)
    _overrides.update(values)
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)


_BUILDS = "builds"


def build_root(cache_dir: Path) -> Path:
    """The judge's build folder under a kernel cache folder: its candidates' builds, and the GPU
    lock files every judge and graph check using that cache share (`locks.gpu_lock_path`)."""
    return Path(cache_dir) / _BUILDS


def cache_dir_of(build_folder: Path) -> Path | None:
    """The kernel cache folder whose build folder (`build_root`) `build_folder` is, None for a
    build folder laid out otherwise: what a builder made from a build folder alone (a judge, its
    worker processes) shares with the other builders of that cache (the precompiled header)."""
    folder = Path(build_folder)
    return folder.parent if folder.name == _BUILDS else None


@dataclass(frozen=True)
class Config:
    """Everything the backend needs to know, passed explicitly from stage to stage."""

    mode: Mode = Mode.CACHE
    cache_dir: Path = field(default_factory=_default_cache_dir)
    seed_cache: bool = True
    llm_url: str = "http://localhost:8000/v1"
    model: str = "cognition-ai/Kevin-32B"
    min_partition: int = 2
    max_partition: int = 64
    record_pending: bool = True
    cpu_kernels: bool = False
    # A KernelGenerator (kevin_backend.generate.kernel_generator); used in mode "generate". When None,
    # a search (generate/generator.py) with `policy`: a name (see KEVIN_POLICY) or a Policy.
    generator: Any = None
    policy: Any = AUTO_POLICY
    # Whose op declarations cut graphs into partitions (and so which cache keys exist): runs that
    # should share cache entries need the same writer. "auto": builtin when the policy is the
    # built-in writer and no generator is given, else general.
    writer: str = "auto"
    trajectories: int = 16
    turns: int = 8
    beam: int = 0
    margin: float = 0.03  # a kernel must beat Inductor by this fraction, beyond the noise, to be kept
    # a search's trajectory stops once its best correct kernel reaches this fraction of the GPU's
    # copy bandwidth (the judge's roofline; 0: never)
    roofline_stop: float = 0.9
    # each compiled graph is timed with and without its kernels; only kernels that make the graph
    # faster stay (backend/graph_check.py)
    graph_check: bool = True

    @classmethod
    def from_env(cls) -> "Config":
        policy = env_value("KEVIN_POLICY")
        try:
            check_policy_name(policy)
        except ConfigError as exc:
            raise ConfigError(f"environment variable KEVIN_POLICY: {exc}") from None
        return cls(
            mode=env_value("KEVIN_MODE"),
            cache_dir=env_value("KEVIN_CACHE_DIR"),
            seed_cache=env_value("KEVIN_SEED_CACHE"),
            llm_url=env_value("KEVIN_LLM_URL"),
            model=env_value("KEVIN_MODEL"),
            min_partition=env_value("KEVIN_MIN_PARTITION"),
            max_partition=env_value("KEVIN_MAX_PARTITION"),
            record_pending=env_value("KEVIN_RECORD_PENDING"),
            cpu_kernels=env_value("KEVIN_CPU_KERNELS"),
            policy=policy,
            writer=env_value("KEVIN_WRITER"),
            trajectories=env_value("KEVIN_TRAJECTORIES"),
            turns=env_value("KEVIN_TURNS"),
            beam=env_value("KEVIN_BEAM"),
            margin=env_value("KEVIN_MARGIN"),
            roofline_stop=env_value("KEVIN_ROOFLINE_STOP"),
            graph_check=env_value("KEVIN_GRAPH_CHECK"),
        )._validated()

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> "Config":
        """The environment's config with `torch.compile(options=...)` applied on top."""
        base = cls.from_env()
        if not options:
            return base
        known = {f.name for f in dataclasses.fields(cls)}  # every field is an option of the same name
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"unknown kevin option(s) {unknown}; known options: {sorted(known)}")
        changes = {name: _coerce(name, value) for name, value in options.items()}
        if isinstance(changes.get("policy"), str):
            try:
                check_policy_name(changes["policy"])
            except ConfigError as exc:
                raise ConfigError(f"kevin option 'policy': {exc}") from None
        return dataclasses.replace(base, **changes)._validated()

    def _validated(self) -> "Config":
        if self.min_partition < 1:
            raise ConfigError(f"min_partition must be >= 1, got {self.min_partition}")
        if self.max_partition < self.min_partition:
            raise ConfigError(
                f"max_partition ({self.max_partition}) must be >= min_partition ({self.min_partition})"
            )
        if self.trajectories < 1 or self.turns < 1 or not 0 <= self.beam <= self.trajectories:
            raise ConfigError(f"need trajectories >= 1, turns >= 1 and 0 <= beam <= trajectories; got "
                              f"{self.trajectories}, {self.turns}, {self.beam}")
        if not -1.0 < self.margin < 1.0:
            raise ConfigError(f"margin must be between -1 and 1 (a fraction of Inductor's speed), got {self.margin}")
        if not 0.0 <= self.roofline_stop:
            raise ConfigError(f"roofline_stop must be a fraction of the copy bandwidth >= 0 (0: never), got {self.roofline_stop}")
        if self.writer not in ("auto", *OP_SUPPORTS):
            raise ConfigError(f"writer must be auto, {', '.join(OP_SUPPORTS[:-1])} or {OP_SUPPORTS[-1]}, got {self.writer!r}")
        if isinstance(self.policy, str):
            check_policy_name(self.policy)
        elif not callable(getattr(self.policy, "generate", None)):
            raise ConfigError("option 'policy' must be a policy name or have a generate(conversations, sampling) method")
        if self.generator is not None and not callable(getattr(self.generator, "generate", None)):
            raise ConfigError("option 'generator' must have a generate(task, key) method")
        return self

    def fingerprint(self) -> dict[str, Any]:
        """The settings that change what the backend compiles (part of Inductor's cache key)."""
        return {
            "mode": self.mode.value,
            "cache_dir": str(self.cache_dir),
            "seed_cache": self.seed_cache,
            "min_partition": self.min_partition,
            "max_partition": self.max_partition,
            "cpu_kernels": self.cpu_kernels,
            "generator": getattr(self.generator, "name", type(self.generator).__name__)
            if self.generator is not None
            else None,
            "policy": self.policy if isinstance(self.policy, str) else getattr(self.policy, "name", type(self.policy).__name__),
            "search": [self.trajectories, self.turns, self.beam, self.margin, self.roofline_stop],
            "writer": self.writer,
            "graph_check": self.graph_check,
        }


def _coerce(name: str, value: Any) -> Any:
    try:
        if name == "mode":
            return Mode(value)
        if name == "cache_dir":
            return Path(value).expanduser()
        if name in ("seed_cache", "record_pending", "cpu_kernels", "graph_check"):
            return _parse_bool(value) if isinstance(value, str) else bool(value)
        if name in ("min_partition", "max_partition", "trajectories", "turns", "beam"):
            if isinstance(value, bool) or int(value) != value:
                raise ValueError("expected an integer")
            return int(value)
        if name in ("margin", "roofline_stop"):
            if isinstance(value, bool):
                raise ValueError("expected a number")
            return float(value)
        if name in ("llm_url", "model", "writer"):
            if not isinstance(value, str):
                raise ValueError("expected a string")
        return value
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"kevin option {name}={value!r} is invalid: {exc}") from exc
