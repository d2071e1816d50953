"""The writer registry: the policy names' grammar (the foundation's data) and the registry agree;
each name makes its writer's policy and cuts graphs by its writer's op support; the command line
checks and describes the names from the registry; the seams' optional abilities are declared
protocols."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kevin_backend.config import AUTO_POLICY, OP_SUPPORTS, POLICY_FORMS, POLICY_NAMES, Config, ConfigError, check_policy_name
from kevin_backend.generate.builtin.builtin_support import BuiltinSupport
from kevin_backend.generate.judging import BatchJudging, ConfigurableJudging, NumericsRetimer
from kevin_backend.generate.op_support import GeneralOpSupport, OpSupport
from kevin_backend.generate.policy import TokenCounter
from kevin_backend.generate.replay import ReplayPolicy
from kevin_backend.generate.writers import (OP_SUPPORT_FACTORIES, WRITERS, argument_problem, make_policy, op_support_for,
                                            policy_help, writer_of)


def test_the_grammar_and_the_registry_agree() -> None:
    assert [form.kind for form in POLICY_FORMS] == list(WRITERS)
    assert all(writer.form is form for form, writer in zip(POLICY_FORMS, WRITERS.values()))
    assert set(OP_SUPPORTS) == set(OP_SUPPORT_FACTORIES)
    assert {writer.support for writer in WRITERS.values()} <= set(OP_SUPPORTS)
    assert POLICY_NAMES == "auto, builtin, openai[:MODEL], vllm[:MODEL], hf:PATH or replay:FILE"
    for form in POLICY_FORMS:  # every usage the names list is one the registry reads
        spec = form.usage.replace("[", "").replace("]", "")
        assert check_policy_name(spec) == spec and writer_of(spec)[0].form is form


@pytest.mark.parametrize("spec, message", [("gpt:whatever", "unknown policy 'gpt:whatever'"), ("hf:", "unknown policy 'hf:'"),
                                           (AUTO_POLICY, "unknown policy 'auto'")])
def test_a_name_of_no_writer_is_refused(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        writer_of(spec)
    assert POLICY_NAMES in str(error.value)


def test_names_make_their_writers_policies(tmp_path: Path) -> None:
    config = Config(cache_dir=tmp_path, llm_url="http://localhost:1/v1", model="m")
    assert make_policy("builtin", config).name == "builtin"
    assert make_policy("openai", config).name == "openai:m" and make_policy("openai:other", config).name == "openai:other"
    assert make_policy(AUTO_POLICY, config).name == "openai:m"  # a model named: the server
    assert make_policy(AUTO_POLICY, Config(cache_dir=tmp_path)).name == "builtin"
    replies = tmp_path / "replies.json"
    replies.write_text('["no code"]')
    assert isinstance(make_policy(f"replay:{replies}", config), ReplayPolicy)
    mine = ReplayPolicy([])
    assert make_policy(mine, config) is mine


def test_the_writer_setting_picks_the_op_support(tmp_path: Path) -> None:
    base = Config(cache_dir=tmp_path)
    assert isinstance(op_support_for(base), BuiltinSupport)  # auto: the built-in writer's
    assert isinstance(op_support_for(Config(cache_dir=tmp_path, policy="openai")), GeneralOpSupport)
    assert isinstance(op_support_for(Config(cache_dir=tmp_path, policy="builtin", writer="general")), GeneralOpSupport)
    assert isinstance(op_support_for(Config(cache_dir=tmp_path, policy="openai", writer="builtin")), BuiltinSupport)
    with_generator = Config(cache_dir=tmp_path, policy="builtin", generator=object())
    assert isinstance(op_support_for(with_generator), GeneralOpSupport)  # someone else's generator: general


def test_every_op_support_declares_its_reduction_keys() -> None:
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(lambda x: torch.sum(x, 1) + torch.sum(x, 0).sum(), tracing_mode="fake")(torch.randn(4, 8)).graph
    sums = [n for n in graph.nodes if n.target is torch.ops.aten.sum.dim_IntList]
    assert len(sums) == 2
    for make in OP_SUPPORT_FACTORIES.values():
        assert isinstance(make(), OpSupport)
    assert [GeneralOpSupport().reduction_key(n) for n in sums] == [None, None]  # any reductions together
    builtin = [BuiltinSupport().reduction_key(n) for n in sums]
    assert None not in builtin and builtin[0] != builtin[1]  # rows and columns kept apart


def test_the_command_line_checks_and_describes_the_names(tmp_path: Path) -> None:
    assert argument_problem(f"replay:{tmp_path / 'missing.json'}") == "no such replies file"
    (tmp_path / "r.json").write_text("[]")
    assert argument_problem(f"replay:{tmp_path / 'r.json'}") == "" and argument_problem(AUTO_POLICY) == ""
    text = policy_help()
    assert all(writer.description in text and writer.form.usage in text for writer in WRITERS.values())
    from kevin_backend.cli import generate_cmd

    parser = argparse.ArgumentParser(prog="kevin")
    generate_cmd.register(parser.add_subparsers(), [])
    shown = parser._subparsers._group_actions[0].choices["generate"].format_help()  # type: ignore[union-attr]
    assert POLICY_NAMES in " ".join(shown.split()) and "scripted replies" in shown


class _ScriptedJudge:
    def judge(self, task_source: str, candidate_source: str) -> object:
        return None


def test_the_optional_abilities_are_declared(tmp_path: Path) -> None:
    from kevin_backend.generate.builtin.builtin_policy import BuiltinPolicy
    from kevin_backend.judge.decide import SandboxRetimer
    from kevin_backend.judge.judge import Judge

    judge = Judge(tmp_path / "builds")
    assert isinstance(judge, BatchJudging) and isinstance(judge, ConfigurableJudging)
    assert not isinstance(_ScriptedJudge(), BatchJudging) and not isinstance(_ScriptedJudge(), ConfigurableJudging)
    assert isinstance(SandboxRetimer(judge), NumericsRetimer) and not isinstance(lambda t, k: None, NumericsRetimer)
    assert isinstance(BuiltinPolicy(), TokenCounter) and not isinstance(ReplayPolicy([]), TokenCounter)
    assert judge.builder.pch_root == tmp_path  # a cache's build folder: the cache's precompiled header
