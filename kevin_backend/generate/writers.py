"""The writer registry: every kernel writer a policy name can choose, with the ops it declares
(`WRITERS`; `policy_help()` lists them as `kevin generate --help` shows them).

The names' grammar is the foundation's (`config.POLICY_FORMS`: a Config refuses a name of no
form when it is built, before anything is imported); each form has one `Writer` here, its
policy factory, its op support and its description. The kevin pass cuts graphs by the op support
(`op_support_for`), the search asks the policy (`make_policy`), and the command line's help and
checks read both. The module imports no torch: the command line builds its help from it, and
each writer's policy and op support are imported when one is made.

The `writer` setting names the op support directly (`general` or `builtin`); `auto` takes the
op support of the configured policy's writer, so that `cache` and `generate` runs with the same
writer cut graphs alike and find each other's cache entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from kevin_backend.config import AUTO_POLICY, OP_SUPPORTS, POLICY_FORMS, POLICY_NAMES, Config, ConfigError, PolicyForm, \
    env_is_set, policy_form

if TYPE_CHECKING:  # imported where used: the command line reads this module's names without torch
    from kevin_backend.generate.op_support import OpSupport
    from kevin_backend.generate.policy import Policy

__all__ = ["Writer", "WRITERS", "OP_SUPPORT_FACTORIES", "AUTO_DESCRIPTION", "writer_of", "make_policy", "resolve_policy_name",
           "argument_problem", "op_support_for", "policy_help"]

AUTO_DESCRIPTION = "openai when a model server is configured, else builtin"


@dataclass(frozen=True)
class Writer:
    """One kernel writer a policy name can choose."""

    form: PolicyForm  # its name's form (`config.POLICY_FORMS`)
    description: str  # one line, for the command line's help
    support: str  # the op declaration that cuts graphs for it (a key of OP_SUPPORT_FACTORIES)
    make: Callable[[str, Config], Policy]  # (the name's argument, the config) -> the policy
    # what is wrong with the name's argument as far as can be seen without making the policy
    # ("" when nothing is): a missing replies file
    check: Callable[[str], str] = lambda arg: ""

    @property
    def name(self) -> str:
        return self.form.kind


def _builtin_policy(arg: str, config: Config) -> Policy:
    from kevin_backend.generate.builtin.builtin_policy import BuiltinPolicy

    return BuiltinPolicy()


def _openai_policy(arg: str, config: Config) -> Policy:
    from kevin_backend.generate.openai_policy import OpenAIPolicy

    return OpenAIPolicy(config.llm_url, arg or config.model)


def _vllm_policy(arg: str, config: Config) -> Policy:
    from kevin_backend.generate.vllm_policy import VLLMPolicy

    return VLLMPolicy(arg or config.model)


def _hf_policy(arg: str, config: Config) -> Policy:
    from kevin_backend.generate.hf_policy import TransformersPolicy

    return TransformersPolicy(arg)


def _replay_policy(arg: str, config: Config) -> Policy:
    from kevin_backend.generate.replay import ReplayPolicy

    return ReplayPolicy.from_file(Path(arg))


def _replies_file_problem(arg: str) -> str:
    return "" if Path(arg).is_file() else "no such replies file"


def _general_support() -> OpSupport:
    from kevin_backend.generate.op_support import GeneralOpSupport

    return GeneralOpSupport()


def _builtin_support() -> OpSupport:
    from kevin_backend.generate.builtin.builtin_support import BuiltinSupport

    return BuiltinSupport()


# The op declarations the `writer` setting names (`config.OP_SUPPORTS`), each made fresh per pass.
OP_SUPPORT_FACTORIES: dict[str, Callable[[], OpSupport]] = {"general": _general_support, "builtin": _builtin_support}

_FORMS = {form.kind: form for form in POLICY_FORMS}
WRITERS: dict[str, Writer] = {w.name: w for w in (
    Writer(_FORMS["builtin"], "the built-in writer (pointwise chains and reductions, no model)", "builtin", _builtin_policy),
    Writer(_FORMS["openai"], "an OpenAI-compatible server at KEVIN_LLM_URL (e.g. `vllm serve cognition-ai/Kevin-32B`)",
           "general", _openai_policy),
    Writer(_FORMS["vllm"], "an in-process vLLM engine (the `vllm` extra)", "general", _vllm_policy),
    Writer(_FORMS["hf"], "transformers `generate` on a local model folder", "general", _hf_policy),
    Writer(_FORMS["replay"], "scripted replies (a JSON list of strings, or a trajectory log .jsonl)", "general",
           _replay_policy, _replies_file_problem),
)}


def writer_of(spec: str) -> tuple[Writer, str]:
    """The writer a policy name (not `auto`: see `resolve_policy_name`) chooses, and the name's
    argument; a ConfigError for a name of no form."""
    form = policy_form(spec)
    if form is None:
        raise ConfigError(f"unknown policy {spec!r}: expected {POLICY_NAMES}")
    return WRITERS[form.kind], spec.partition(":")[2]


def resolve_policy_name(spec: str, config: Config) -> str:
    """`auto` is the model server when one is configured (a model name or server URL given, as
    an option or in the environment), else the built-in writer."""
    if spec != AUTO_POLICY:
        return spec
    defaults = Config()
    configured = (env_is_set("KEVIN_LLM_URL") or env_is_set("KEVIN_MODEL")
                  or config.llm_url != defaults.llm_url or config.model != defaults.model)
    return "openai" if configured else "builtin"


def make_policy(spec: str | Policy, config: Config | None = None) -> Policy:
    """The policy a name stands for (a Policy object is returned as is). Without a config, the
    environment's (a caller that has nothing else)."""
    if not isinstance(spec, str):
        return spec
    config = config or Config.from_env()
    writer, arg = writer_of(resolve_policy_name(spec, config))
    return writer.make(arg, config)


def argument_problem(spec: str) -> str:
    """What is wrong with a valid policy name's argument that can be seen before the policy is
    made (a replies file that is not there), "" when nothing is: the command line's check."""
    if spec == AUTO_POLICY:
        return ""
    writer, arg = writer_of(spec)
    return writer.check(arg)


def op_support_for(config: Config) -> OpSupport:
    """The partitions the writer can take (the built-in writer declares fewer ops than a model).
    Chosen by the `writer` setting, not the mode, so `cache` and `generate` runs with the same
    writer cut graphs alike and find each other's cache entries: `auto` is the op support of the
    configured policy's writer when the policy is a name and no generator is given, else general."""
    name = config.writer
    if name == "auto":
        name = "general"
        if config.generator is None and isinstance(config.policy, str):
            name = writer_of(resolve_policy_name(config.policy, config))[0].support
    return OP_SUPPORT_FACTORIES[name]()


def policy_help() -> str:
    """The policy names and what each writer is, one line each (the command line's help)."""
    rows = [(AUTO_POLICY, AUTO_DESCRIPTION), *((w.form.usage, w.description) for w in WRITERS.values())]
    width = max(len(usage) for usage, _ in rows)
    return "policies:\n" + "\n".join(f"  {usage:<{width}}  {text}" for usage, text in rows)
