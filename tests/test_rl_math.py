"""The trainer's math on the CPU: discounted returns, per-task advantages, the clipped loss with
clip-higher and Dr. GRPO's constant normalization, which tokens carry loss, and padding."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kevin_backend.generate.engine import TurnRecord
from kevin_backend.generate.policy import Reply
from kevin_backend.generate.prompts import Turn
from kevin_backend.judge.result import JudgeResult, JudgeTimings, Reason, Stage
from kevin_backend.rl.loss import LossSettings, clipped_loss, sequence_logprobs, token_logprobs
from kevin_backend.rl.returns import discounted_returns, group_advantages
from kevin_backend.rl.samples import Sample, collate, completion_text, sample_from_record, with_advantages

sys.path.insert(0, str(Path(__file__).resolve().parent))

# ---------------------------------------------------------------------------------------------
# returns and advantages


def test_discounted_returns_of_the_recipe() -> None:
    """A failed turn, a correct-but-slow turn, a correct 1x turn: each earlier turn is credited
    with 0.4 of what came after it."""
    assert discounted_returns([0.0, 0.3, 1.3], 0.4) == pytest.approx([0.328, 0.82, 1.3])
    assert discounted_returns([1.0, 2.0], 0.0) == [1.0, 2.0]
    assert discounted_returns([1.0, 2.0], 1.0) == [3.0, 2.0]
    assert discounted_returns([], 0.4) == []
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns([1.0], 1.5)


def test_equal_scores_give_zero_advantages_never_nan() -> None:
    for mode in ("mean", "mean_std"):
        assert group_advantages([0.0] * 16, mode) == [0.0] * 16
        assert group_advantages([1.3, 1.3, 1.3], mode) == [0.0, 0.0, 0.0]
        assert group_advantages([2.5], mode) == [0.0]
        assert group_advantages([], mode) == []
    values = group_advantages([1.3 + 1e-12, 1.3, 1.3 - 1e-12], "mean_std")
    assert all(math.isfinite(v) and v == 0.0 for v in values)


def test_advantages_normalize_within_the_group() -> None:
    returns = [0.0, 1.0, 2.0, 5.0]
    mean_only = group_advantages(returns, "mean")
    assert mean_only == pytest.approx([-2.0, -1.0, 0.0, 3.0])
    scaled = group_advantages(returns, "mean_std")
    assert sum(scaled) == pytest.approx(0.0, abs=1e-12)
    assert math.sqrt(sum(a * a for a in scaled) / 4) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="mode"):
        group_advantages(returns, "std")


def _sample(group: str, trajectory: int, turn: int, score: float, completion: int = 3, prompt: int = 4) -> Sample:
    return Sample(task=group.split(":")[-1], group=group, trajectory=trajectory, turn=turn,
                  prompt_ids=tuple(range(1, prompt + 1)), completion_ids=tuple(range(10, 10 + completion)),
                  text="", score=score, correct=score > 0, speedup=None, finish_reason="stop")


def test_with_advantages_discounts_per_trajectory_and_normalizes_per_search() -> None:
    """Two trajectories of one search (turns given out of order), and a second search whose
    scores are all equal: returns follow each trajectory's turns; advantages compare the first
    search's four samples with each other only; the equal search gets zeros."""
    samples = [
        _sample("0:a", 0, 1, 1.3), _sample("0:a", 0, 0, 0.0),
        _sample("0:a", 1, 0, 0.3), _sample("0:a", 1, 1, 0.0),
        _sample("1:b", 0, 0, 0.0), _sample("1:b", 0, 1, 0.0),
    ]
    out = with_advantages(samples, 0.4, "mean")
    assert [s.ret for s in out[:4]] == pytest.approx([1.3, 0.52, 0.3, 0.0])
    mean = (1.3 + 0.52 + 0.3 + 0.0) / 4
    assert [s.advantage for s in out[:4]] == pytest.approx([1.3 - mean, 0.52 - mean, 0.3 - mean, -mean])
    assert [s.advantage for s in out[4:]] == [0.0, 0.0]
    with pytest.raises(ValueError, match="gap or a duplicate"):
        with_advantages([_sample("0:a", 0, 0, 1.0), _sample("0:a", 0, 2, 1.0)], 0.4, "mean")


def test_the_same_task_twice_in_a_batch_forms_two_groups() -> None:
    samples = [_sample("0:a", 0, 0, 1.0), _sample("1:a", 0, 0, 3.0)]
    assert [s.advantage for s in with_advantages(samples, 0.4, "mean_std")] == [0.0, 0.0]


# ---------------------------------------------------------------------------------------------
# the clipped loss

SETTINGS = LossSettings(clip_low=0.2, clip_high=0.28, kl_coef=0.0, length_norm=10)


def _one_token(ratio: float, advantage: float) -> tuple[torch.Tensor, torch.Tensor]:
    logprobs = torch.tensor([[math.log(0.5) + math.log(ratio)]], requires_grad=True)
    old = torch.tensor([[math.log(0.5)]])
    loss, _ = clipped_loss(logprobs, old, torch.tensor([advantage]), torch.ones(1, 1), SETTINGS, samples_in_step=1)
    loss.backward()
    return loss.detach() * SETTINGS.length_norm, logprobs.grad


@pytest.mark.parametrize(
    "ratio, advantage, token_loss, clipped",
    [
        (1.0, 1.0, -1.0, False),
        (1.2, 1.0, -1.2, False),   # inside the high bound
        (1.5, 1.0, -1.28, True),   # a good token may rise to 1.28x, no further this step
        (0.7, 1.0, -0.7, False),   # a good token that fell: the pessimistic (unclipped) branch
        (0.7, -1.0, 0.8, True),    # a bad token may fall to 0.8x, no further
        (1.25, -1.0, 1.25, False),
        (1.5, -1.0, 1.5, False),   # a bad token that rose: unclipped, pushed back down
    ],
)
def test_clip_higher(ratio: float, advantage: float, token_loss: float, clipped: bool) -> None:
    loss, grad = _one_token(ratio, advantage)
    assert float(loss) == pytest.approx(token_loss, rel=1e-6)
    assert (float(grad) == 0.0) == clipped


def test_constant_length_normalization() -> None:
    """Dr. GRPO: every token weighs the same, whatever its reply's length: the sum of token
    losses over the step divided by length_norm * samples (not by each sample's length)."""
    logprobs = torch.zeros(2, 6, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]], dtype=torch.float32)
    advantages = torch.tensor([1.0, 1.0])
    loss, stats = clipped_loss(logprobs, logprobs.detach(), advantages, mask, SETTINGS, samples_in_step=4)
    assert loss.item() == pytest.approx(-8 / (10 * 4))
    assert stats.tokens == 8
    loss.backward()
    assert torch.equal(logprobs.grad, -mask / 40)  # the same weight on each of the 8 tokens
    twice, _ = clipped_loss(logprobs, logprobs.detach(), advantages, mask,
                            LossSettings(length_norm=20), samples_in_step=4)
    assert twice.item() == pytest.approx(loss.item() / 2)


def test_kl_term_against_the_reference() -> None:
    logprobs = torch.zeros(1, 2)
    ref = torch.tensor([[0.5, 0.0]])
    settings = LossSettings(kl_coef=0.1, length_norm=1)
    loss, stats = clipped_loss(logprobs, logprobs, torch.tensor([0.0]), torch.ones(1, 2), settings, 1, ref)
    k3 = math.exp(0.5) - 0.5 - 1.0
    assert stats.kl_sum == pytest.approx(k3)
    assert float(loss) == pytest.approx(0.1 * k3)
    with pytest.raises(ValueError, match="reference"):
        clipped_loss(logprobs, logprobs, torch.tensor([0.0]), torch.ones(1, 2), settings, 1, None)


def test_token_logprobs_use_the_sampling_temperature() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    got = token_logprobs(logits, torch.tensor([0]), temperature=0.5)
    assert float(got) == pytest.approx(float(torch.log_softmax(logits / 0.5, -1)[0, 0]), rel=1e-5)


# ---------------------------------------------------------------------------------------------
# samples from turns: which tokens carry the loss


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("transformers")
    from tiny_lm import tiny_model, train_tokenizer

    tokenizer = train_tokenizer()
    return tokenizer, tiny_model(tokenizer).train()


FEEDBACK = "The kernel compiled and ran, but its output differs from the reference: max abs diff 0.25."


def _records(tokenizer) -> list[TurnRecord]:
    """Two turns of one trajectory: the second turn's prompt holds the first turn's code and the
    judge's feedback; the replies carry the token ids the policy sampled."""
    result = JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=JudgeTimings(1.0, 1.8, 1.5, 10))
    first_text = "__global__ void add_relu_kernel(const float* x) { int i = blockIdx.x; }"
    second_text = "int n = x.numel(); int threads = 256;"
    system = {"role": "system", "content": "You are a CUDA kernel engineer."}
    task = {"role": "user", "content": "def get_inputs(): return [torch.randn(4096, 4096, device='cuda')]"}
    records = []
    for turn, (text, messages) in enumerate([
        (first_text, (system, task)),
        (second_text, (system, task, {"role": "assistant", "content": first_text}, {"role": "user", "content": FEEDBACK})),
    ]):
        ids = tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        reply = Reply(text=text, extra={"completion_ids": ids})
        step = Turn(reply, text, "", result, FEEDBACK)
        records.append(TurnRecord(0, turn, None, messages, step, result.score, 0.0, 0.0))
    return records


def test_a_sample_is_the_prompt_as_sent_and_the_reply_as_sampled(tiny) -> None:
    tokenizer, _ = tiny
    first, second = (sample_from_record(r, "task", tokenizer) for r in _records(tokenizer))
    prompt = tokenizer.decode(list(second.prompt_ids))
    assert FEEDBACK in prompt and prompt.endswith("<|im_start|>assistant\n")
    assert second.completion_ids[-1] == tokenizer.eos_token_id
    assert second.score == pytest.approx(0.3 + 1.8) and second.correct and second.speedup == pytest.approx(1.8)
    batch = collate([first, second], pad_id=tokenizer.pad_token_id)
    for row, s in enumerate((first, second)):
        start = len(s.prompt_ids) - 1
        expect = torch.zeros(batch.loss_mask.shape[1])
        expect[start: start + len(s.completion_ids)] = 1
        assert torch.equal(batch.loss_mask[row], expect)
        # position p's mask weighs token p + 1: exactly the completion's tokens
        predicted = batch.input_ids[row, 1:][batch.loss_mask[row].bool()].tolist()
        assert predicted == list(s.completion_ids)


def test_reply_rebuilt_from_text_when_no_tokens_were_recorded() -> None:
    reply = Reply(text="answer", reasoning="let me think")
    assert completion_text(reply) == "<think>\nlet me think\n</think>\n\nanswer"
    assert completion_text(reply, "<|im_start|>assistant\n<think>\n") == "let me think\n</think>\n\nanswer"
    assert completion_text(Reply(text="just code")) == "just code"


def test_prompt_and_feedback_positions_get_exactly_zero_gradient(tiny) -> None:
    """Backpropagate the loss of a two-turn batch through the tiny model and look at the gradient
    reaching the logits: zero, exactly, at every position that predicts a prompt token (the
    system and task messages, the earlier turn, the judge's feedback) or padding; non-zero on the
    reply. Old log-probs are perturbed so ratios differ from 1."""
    tokenizer, model = tiny
    samples = [sample_from_record(r, "task", tokenizer) for r in _records(tokenizer)]
    samples = [replace(s, advantage=a) for s, a in zip(samples, (1.0, -0.5))]
    batch = collate(samples, pad_id=tokenizer.pad_token_id)
    seen = {}

    def keep(module, inputs, output):
        output.retain_grad()
        seen["logits"] = output

    handle = model.lm_head.register_forward_hook(keep)
    try:
        logprobs = sequence_logprobs(model, batch, temperature=0.9)
    finally:
        handle.remove()
    old = (logprobs.detach() + 0.05 * torch.randn_like(logprobs)) * batch.loss_mask
    loss, _ = clipped_loss(logprobs, old, batch.advantages, batch.loss_mask, SETTINGS, samples_in_step=2)
    loss.backward()
    grad = seen["logits"].grad  # [B, kept positions, V]
    first, last = batch.keep()
    assert grad.shape[1] == last - first
    mask = batch.loss_mask[:, first:last]
    norms = grad.abs().sum(dim=-1)
    assert torch.count_nonzero(norms[mask == 0]) == 0
    assert bool((norms[mask != 0] > 0).all())
    # the kept window starts at the first reply: the prompt positions before it never reach the LM head
    assert first == min(len(s.prompt_ids) for s in samples) - 1


def test_zero_gradient_on_the_full_logits_path(tiny) -> None:
    """The same with a model that returns logits for every position (no `logits_to_keep`): the
    gradient is a tensor over the whole sequence, zero on every prompt and feedback token."""
    tokenizer, _ = tiny
    samples = [sample_from_record(r, "task", tokenizer) for r in _records(tokenizer)]
    samples = [replace(s, advantage=1.0) for s in samples]
    batch = collate(samples, pad_id=tokenizer.pad_token_id)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.logits = torch.nn.Parameter(torch.randn(batch.size, batch.input_ids.shape[1], len(tokenizer)))

        def forward(self, input_ids, attention_mask, use_cache):
            return SimpleNamespace(logits=self.logits)

    fake = Logits()
    logprobs = sequence_logprobs(fake, batch, temperature=1.0)
    loss, _ = clipped_loss(logprobs, logprobs.detach(), batch.advantages, batch.loss_mask, SETTINGS, 2)
    loss.backward()
    norms = fake.logits.grad.abs().sum(dim=-1)[:, :-1]
    assert torch.count_nonzero(norms[batch.loss_mask == 0]) == 0
    assert bool((norms[batch.loss_mask != 0] > 0).all())
    second = samples[1]
    feedback_ids = tokenizer(FEEDBACK, add_special_tokens=False).input_ids
    text_ids = list(second.prompt_ids)
    at = next(i for i in range(len(text_ids)) if text_ids[i: i + len(feedback_ids)] == feedback_ids)
    assert torch.count_nonzero(norms[1, at - 1: at + len(feedback_ids)]) == 0  # the feedback, exactly


def _loss_and_grads(model, samples, width=None, samples_in_step=2):
    model.zero_grad()
    batch = collate(samples, pad_id=0, width=width)
    logprobs = sequence_logprobs(model, batch, temperature=0.9)
    old = logprobs.detach() - 0.1 * batch.loss_mask  # ratios of e^0.1: some tokens clipped
    loss, _ = clipped_loss(logprobs, old, batch.advantages, batch.loss_mask, SETTINGS, samples_in_step)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_padding_does_not_change_the_loss(tiny) -> None:
    """The same samples padded to their own width, padded 37 tokens wider, and run one per
    micro-batch: the same loss and the same gradients (right padding with a causal model)."""
    tokenizer, model = tiny
    samples = [sample_from_record(r, "task", tokenizer) for r in _records(tokenizer)]
    samples = [replace(s, advantage=a) for s, a in zip(samples, (1.0, -0.5))]
    tight, tight_grads = _loss_and_grads(model, samples)
    wide, wide_grads = _loss_and_grads(model, samples, width=max(s.length for s in samples) + 37)
    assert wide == pytest.approx(tight, rel=1e-6, abs=1e-9)
    # gradients agree up to float32 summation order (sums over more or fewer positions)
    for name in tight_grads:
        torch.testing.assert_close(wide_grads[name], tight_grads[name], rtol=1e-4, atol=1e-5 * _scale(tight_grads))
    apart = [_loss_and_grads(model, [s]) for s in samples]
    assert sum(a[0] for a in apart) == pytest.approx(tight, rel=1e-6, abs=1e-9)
    for name in tight_grads:
        torch.testing.assert_close(apart[0][1][name] + apart[1][1][name], tight_grads[name], rtol=1e-4,
                                   atol=1e-5 * _scale(tight_grads))


def _scale(grads: dict[str, torch.Tensor]) -> float:
    return max(float(g.abs().max()) for g in grads.values())


def test_zero_weight_fillers_change_nothing(tiny) -> None:
    tokenizer, model = tiny
    samples = [sample_from_record(r, "task", tokenizer) for r in _records(tokenizer)]
    samples = [replace(s, advantage=1.0) for s in samples]
    filler = replace(samples[0], weight=0.0, advantage=3.0)
    base, base_grads = _loss_and_grads(model, samples)
    filled, filled_grads = _loss_and_grads(model, [*samples, filler])
    assert filled == pytest.approx(base, rel=1e-6)
    for name in base_grads:
        torch.testing.assert_close(filled_grads[name], base_grads[name], rtol=1e-4, atol=1e-5 * _scale(base_grads))
