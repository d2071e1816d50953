"""The model policies against a real model and real HTTP: a tiny Qwen2 model trained and saved
here (tests/tiny_lm.py), served by a loopback OpenAI-compatible server (tests/openai_server.py),
nothing downloaded."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch

from kevin_backend.config import ConfigError
from kevin_backend.generate.openai_policy import OpenAIPolicy, Retry
from kevin_backend.generate.policy import Policy, PolicyError, Reply, Sampling, split_reasoning

pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openai_server import TinyOpenAIServer  # noqa: E402
from tiny_lm import build_tiny_lm  # noqa: E402

MODEL = "tiny-kevin"
FAST_RETRY = Retry(attempts=3, backoff=0.01)
GREEDY = Sampling(temperature=0.0, max_tokens=12)

CONVERSATIONS = [
    [{"role": "user", "content": "Write a CUDA kernel for relu."}],
    [{"role": "system", "content": "You are a CUDA kernel engineer."},
     {"role": "user", "content": "Fuse add and relu over two float tensors."}],
    [{"role": "user", "content": "def forward(self, x): return torch.relu(x) * 2"},
     {"role": "assistant", "content": "__global__ void k(float* x) {}"},
     {"role": "user", "content": "It compiled but the output differs; fix it."}],
]


@pytest.fixture(scope="module", autouse=True)
def offline() -> Iterator[None]:
    """No hub access for anything this module loads."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        yield


@pytest.fixture(scope="module")
def hf_policy(tmp_path_factory: pytest.TempPathFactory):
    from kevin_backend.generate.hf_policy import TransformersPolicy

    folder = build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))
    return TransformersPolicy(folder, device="cpu", batch_size=4)


@pytest.fixture(scope="module")
def live_server(hf_policy) -> Iterator[TinyOpenAIServer]:
    with TinyOpenAIServer(hf_policy, model=MODEL) as server:
        yield server


@pytest.fixture()
def server(live_server: TinyOpenAIServer) -> TinyOpenAIServer:
    live_server.reset()
    return live_server


def client(server: TinyOpenAIServer, **kwargs) -> OpenAIPolicy:
    kwargs.setdefault("retry", FAST_RETRY)
    kwargs.setdefault("timeout", 60)
    return OpenAIPolicy(server.url, kwargs.pop("model", MODEL), **kwargs)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- split_reasoning ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, field, want",
    [
        ("plain answer", None, ("plain answer", "")),
        ("  answer \n", "  thought  ", ("answer", "thought")),  # the server's field wins
        ("<think>plan it</think>\n\nthe kernel", None, ("the kernel", "plan it")),
        ("<think>cut off at the token lim", None, ("", "cut off at the token lim")),  # unclosed
        ("the template ate the tag</think>answer", None, ("answer", "the template ate the tag")),
        ("<think>a</think>x <think>b</think>y", None, ("x y", "a\n\nb")),
        ("<think>  </think>answer", None, ("answer", "")),  # empty thought is no reasoning
        ("", "", ("", "")),
    ],
)
def test_split_reasoning(text: str, field: str | None, want: tuple[str, str]) -> None:
    assert split_reasoning(text, field) == want


# -- OpenAIPolicy against the loopback server -------------------------------------------------------


def test_batch_of_three_gets_the_models_replies_with_token_counts(server: TinyOpenAIServer, hf_policy) -> None:
    policy = client(server)
    assert isinstance(policy, Policy)
    sampling = Sampling(temperature=0.0, max_tokens=12, seed=5, stop=("@@",))
    replies = policy.generate(CONVERSATIONS, sampling)
    assert len(replies) == 3 and all(r.ok for r in replies), [r.error for r in replies]
    direct = hf_policy.generate(CONVERSATIONS, sampling)
    assert [r.text for r in replies] == [r.text for r in direct]  # in order, the model's own words
    for reply, messages in zip(replies, CONVERSATIONS):
        assert reply.prompt_tokens == hf_policy.count_tokens(hf_policy.render(messages))
        assert 0 < reply.completion_tokens <= 12
        assert reply.finish_reason in ("stop", "length") and reply.seconds > 0
    sent = sorted(server.payloads, key=lambda p: p["seed"])
    assert [p["seed"] for p in sent] == [5, 6, 7]  # seed + index: identical prompts still differ
    assert all(p["model"] == MODEL and p["max_tokens"] == 12 and p["stop"] == ["@@"]
               and p["temperature"] == 0.0 and p["top_p"] == 1.0 for p in sent)
    assert [p["messages"] for p in sent] == CONVERSATIONS  # conversation i went with seed 5 + i


@pytest.mark.parametrize("style", ["reasoning_content", "reasoning", "tags"])
def test_reasoning_is_split_from_the_answer(server: TinyOpenAIServer, style: str) -> None:
    plain = client(server).generate(CONVERSATIONS[:1], GREEDY)[0]
    server.reasoning, server.reasoning_style = "one thread per element, then coalesce", style
    reply = client(server).generate(CONVERSATIONS[:1], GREEDY)[0]
    assert reply.reasoning == "one thread per element, then coalesce"
    assert reply.text == plain.text and "think>" not in reply.text


def test_server_down_names_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    monkeypatch.setenv("KEVIN_LLM_URL", url)
    policy = OpenAIPolicy(retry=FAST_RETRY)
    start = time.monotonic()
    with pytest.raises(PolicyError, match="no server answers at " + url) as info:
        policy.generate(CONVERSATIONS, GREEDY)
    assert "vllm serve" in str(info.value) and "KEVIN_LLM_URL" in str(info.value)
    assert time.monotonic() - start < 5


def test_timeout_names_the_url_and_seconds(server: TinyOpenAIServer) -> None:
    server.delay = 3.0
    start = time.monotonic()
    with pytest.raises(PolicyError, match=r"did not answer within 0\.4 seconds") as info:
        client(server, timeout=0.4).generate(CONVERSATIONS[:2], GREEDY)
    assert server.url in str(info.value)
    assert time.monotonic() - start < 2.5  # not retried, not waiting for the server


def test_wrong_model_lists_the_served_models(server: TinyOpenAIServer) -> None:
    with pytest.raises(PolicyError, match="does not serve model 'kevin-7b'") as info:
        client(server, model="kevin-7b").generate(CONVERSATIONS, GREEDY)
    assert "it serves: tiny-kevin" in str(info.value) and "KEVIN_MODEL" in str(info.value)
    assert client(server).served_models() == [MODEL]


def test_url_that_is_not_the_api_base_says_so(server: TinyOpenAIServer) -> None:
    policy = OpenAIPolicy(server.url.removesuffix("/v1"), MODEL, retry=FAST_RETRY)
    with pytest.raises(PolicyError, match="404.*ends in /v1"):
        policy.generate(CONVERSATIONS[:1], GREEDY)


def test_one_bad_conversation_fails_alone(server: TinyOpenAIServer) -> None:
    server.context_tokens = 200
    too_long = [{"role": "user", "content": "int i = blockIdx.x * blockDim.x + threadIdx.x;\n" * 60}]
    replies = client(server).generate([CONVERSATIONS[0], too_long, CONVERSATIONS[1]], GREEDY)
    assert [r.ok for r in replies] == [True, False, True]
    bad = replies[1]
    assert bad.finish_reason == "error" and "400" in bad.error and "maximum context length is 200" in bad.error
    assert replies[0].text and replies[2].completion_tokens > 0


def test_503_is_retried_until_it_succeeds(server: TinyOpenAIServer) -> None:
    server.fail_first = 2
    (reply,) = client(server, retry=Retry(attempts=3, backoff=0.01)).generate(CONVERSATIONS[:1], GREEDY)
    assert reply.ok and reply.completion_tokens > 0
    assert server.requests == 3


def test_a_batch_that_fails_whole_raises(server: TinyOpenAIServer) -> None:
    server.fail_first = 100
    with pytest.raises(PolicyError, match="failed every request of the batch.*503.*starting"):
        client(server, retry=Retry(attempts=2, backoff=0.01)).generate(CONVERSATIONS[:2], GREEDY)
    assert server.requests == 4  # two conversations, two attempts each


def test_api_key_and_settings_come_from_the_environment(server: TinyOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEVIN_LLM_URL", server.url)
    monkeypatch.setenv("KEVIN_MODEL", MODEL)
    monkeypatch.setenv("KEVIN_LLM_API_KEY", "sekret")
    monkeypatch.setenv("KEVIN_LLM_TIMEOUT", "42.5")
    monkeypatch.setenv("KEVIN_LLM_CONCURRENCY", "2")
    policy = OpenAIPolicy(retry=FAST_RETRY)
    assert (policy.timeout, policy.concurrency, policy.name) == (42.5, 2, f"openai:{MODEL}")
    assert policy.generate(CONVERSATIONS[:1], GREEDY)[0].ok
    assert server.headers.get("Authorization") == "Bearer sekret"
    assert policy.count_tokens("x" * 40) == 10 and policy.count_tokens("") == 0
    assert policy.generate([], GREEDY) == []
    monkeypatch.setenv("KEVIN_LLM_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="KEVIN_LLM_TIMEOUT"):
        OpenAIPolicy()


# -- TransformersPolicy directly ---------------------------------------------------------------------


def test_transformers_replies_and_counts(hf_policy) -> None:
    replies = hf_policy.generate(CONVERSATIONS, Sampling(temperature=0.0, max_tokens=6))
    assert len(replies) == 3 and all(isinstance(r, Reply) and r.ok for r in replies)
    for reply, messages in zip(replies, CONVERSATIONS):
        assert reply.prompt_tokens == hf_policy.count_tokens(hf_policy.render(messages)) > 0
        assert 0 < reply.completion_tokens <= 6  # max_tokens respected
        assert reply.finish_reason == ("length" if reply.completion_tokens == 6 else "stop")
    assert any(r.finish_reason == "length" for r in replies)
    assert hf_policy.render(CONVERSATIONS[0]).endswith("<|im_start|>assistant\n")


def test_transformers_greedy_is_deterministic_and_batch_independent(hf_policy) -> None:
    batch = hf_policy.generate(CONVERSATIONS, GREEDY)
    again = hf_policy.generate(CONVERSATIONS, GREEDY)
    alone = [hf_policy.generate([c], GREEDY)[0] for c in CONVERSATIONS]
    assert [r.text for r in batch] == [r.text for r in again] == [r.text for r in alone]  # left padding is right
    assert len({r.text for r in batch}) == 3


def test_transformers_seed_reproduces_without_touching_global_rng(hf_policy) -> None:
    sampled = Sampling(temperature=1.0, max_tokens=16, seed=7)
    state = torch.random.get_rng_state()
    first = [r.text for r in hf_policy.generate(CONVERSATIONS, sampled)]
    assert torch.equal(torch.random.get_rng_state(), state)
    assert [r.text for r in hf_policy.generate(CONVERSATIONS, sampled)] == first
    other = Sampling(temperature=1.0, max_tokens=16, seed=8)
    assert [r.text for r in hf_policy.generate(CONVERSATIONS, other)] != first


def test_transformers_stop_string_ends_the_reply(hf_policy) -> None:
    (full,) = hf_policy.generate(CONVERSATIONS[:1], Sampling(temperature=0.0, max_tokens=24))
    stop = full.text[len(full.text) // 2:][:3]
    assert len(stop) == 3
    (cut,) = hf_policy.generate(CONVERSATIONS[:1], Sampling(temperature=0.0, max_tokens=24, stop=(stop,)))
    assert cut.text == full.text[:full.text.index(stop)].strip()
    assert cut.finish_reason == "stop" and cut.completion_tokens < full.completion_tokens


def test_transformers_missing_model_is_a_policy_error(tmp_path: Path) -> None:
    from kevin_backend.generate.hf_policy import TransformersPolicy

    with pytest.raises(PolicyError, match="cannot load a causal LM from .*no_model"):
        TransformersPolicy(tmp_path / "no_model", device="cpu")


# -- VLLMPolicy ----------------------------------------------------------------------------------------


def test_vllm_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.generate.vllm_policy import VLLMPolicy

    monkeypatch.setitem(sys.modules, "vllm", None)  # an import of vllm fails, installed or not
    with pytest.raises(PolicyError, match=r"needs vLLM.*pip install 'kevin_backend\[vllm\]'.*OpenAIPolicy"):
        VLLMPolicy("cognition-ai/Kevin-32B", tensor_parallel_size=2)
