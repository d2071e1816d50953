"""The sandboxed run on the CPU: verdicts for honest, wrong, mutating, replaying, crashing and
hanging candidates. The "kernels" here compute with numpy (no PyTorch op is dispatched, so the
forward audit lets them through); on the GPU the same runner judges CUDA candidates."""

from __future__ import annotations

import pytest

from kevin_backend.judge.sandbox import RunConfig, run_in_sandbox
from kevin_backend.judge.timing_phase import MAX_SLOTS, MIN_ROUNDS, plan_slots
from conftest import pooled_run

TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, w):
        return torch.sigmoid(x) * w + 1.0


def get_inputs():
    return [torch.randn(64, 32), torch.randn(64, 32)]


def get_init_inputs():
    return []
'''


def candidate(body: str, init: str = "") -> str:
    return (
        "import numpy as np\nimport torch\nimport torch.nn as nn\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n" + (init or "") +
        "\n    def forward(self, x, w):\n" + body
    )


NUMPY = "        a, b = x.numpy(), w.numpy()\n"
HONEST = candidate(NUMPY + "        return torch.from_numpy((1.0 / (1.0 + np.exp(-a)) * b + 1.0).astype(np.float32))\n")

FAST = RunConfig(seeds=(1, 2, 3), trials=5, warmup=1, timeout=120, inductor=False)


def judge(source: str, config: RunConfig = FAST, task: str = TASK):
    """The verdict of this process's warm judge worker (the one-shot worker's own start, clock and
    death are tested through `run_in_sandbox`)."""
    return pooled_run(task, source, config)


def test_honest_candidate_is_accepted_and_timed() -> None:
    out = judge(HONEST)
    assert (out.stage, out.reason) == ("timing", "ACCEPTED"), out.feedback
    assert out.kernel_ms is not None and out.kernel_ms > 0 and out.eager_ms is not None and out.eager_ms > 0


@pytest.mark.parametrize(
    "source, reason",
    [
        (candidate("        return torch.sigmoid(x) * w + 1.0\n"), "PYTORCH_COMPUTE"),
        (candidate(NUMPY + "        return torch.from_numpy((1.0 / (1.0 + np.exp(-a)) * b + 1.5).astype(np.float32))\n"), "MISMATCH"),
        (candidate(NUMPY + "        return torch.from_numpy((1.0 / (1.0 + np.exp(-a)) * b + 1.0).astype(np.float64))\n"), "DTYPE_MISMATCH"),
        (candidate(NUMPY + "        return torch.from_numpy((1.0 / (1.0 + np.exp(-a)) * b + 1.0).astype(np.float32)[:10])\n"), "SHAPE_MISMATCH"),
        (candidate(NUMPY + "        r = (1.0 / (1.0 + np.exp(-a)) * b + 1.0).astype(np.float32)\n        r[0, 0] = np.inf\n        return torch.from_numpy(r)\n"), "NAN_INF"),
        (candidate(NUMPY + "        b[:] = 1.0 / (1.0 + np.exp(-a)) * b + 1.0\n        return torch.from_numpy(b.copy())\n"), "INPUT_MUTATED"),
        (candidate("        raise ValueError('kernel failed to launch')\n"), "RUNTIME_ERROR"),
    ],
    ids=["pytorch-compute", "wrong-values", "wrong-dtype", "wrong-shape", "inf", "mutates-input", "raises"],
)
def test_wrong_candidates_get_the_right_reason(source: str, reason: str) -> None:
    out = judge(source)
    assert out.reason == reason, (out.reason, out.feedback)
    if reason == "MISMATCH":
        assert out.mismatch["bad_elements"] == out.mismatch["total_elements"] == 64 * 32
        assert abs(out.mismatch["max_abs_error"] - 0.5) < 1e-6


def test_output_cached_by_input_pointer_is_caught() -> None:
    # computes each input buffer's answer once and returns it whenever that buffer comes back:
    # the timing refills its rotating slots with fresh values every round, and a random timed
    # call's output is checked, so the stale answer is found
    source = candidate(
        "        key = (x.data_ptr(), w.data_ptr())\n"
        "        self.calls += 1\n"
        "        if self.calls < 8 or key not in self.seen:\n"
        "            a, b = x.numpy(), w.numpy()\n"
        "            self.seen[key] = torch.from_numpy((1.0 / (1.0 + np.exp(-a)) * b + 1.0).astype(np.float32))\n"
        "        return self.seen[key].clone()\n",
        init="        self.seen, self.calls = {}, 0\n",
    )
    out = judge(source)
    assert out.reason == "REPLAYED_OUTPUT", (out.reason, out.feedback)
    assert "fresh values" in out.feedback


def test_pointer_cache_with_a_spot_check_computes_every_timed_call() -> None:
    # the audit's exploit of issue 33: cache by pointer, check one element. Computing takes 10 ms
    # here, a cache hit nothing; fresh values in every slot make the check fail each time, so every
    # timed call computes: accepted at its honest time (before, the timed calls reused one set of
    # buffers and values and it was timed at the cache's speed)
    source = candidate(
        "        key = (x.data_ptr(), w.data_ptr())\n"
        "        hit = self.seen.get(key)\n"
        "        if hit is not None and float(x[0, 0]) == hit[0]:\n"
        "            return hit[1].clone()\n"
        "        __import__('time').sleep(0.01)\n"
        "        a, b = x.numpy(), w.numpy()\n"
        "        out = torch.from_numpy((1.0 / (1.0 + np.exp(-a)) * b + 1.0).astype(np.float32))\n"
        "        self.seen[key] = (float(x[0, 0]), out)\n"
        "        return out.clone()\n",
        init="        self.seen = {}\n",
    )
    out = judge(source)
    assert out.reason == "ACCEPTED", (out.reason, out.feedback)
    assert out.kernel_ms is not None and out.kernel_ms >= 9.0, out.kernel_ms


def test_crash_and_hang_are_verdicts_not_errors() -> None:
    crash = candidate("        import os, signal\n        os.kill(os.getpid(), signal.SIGSEGV)\n")
    out = judge(crash)
    assert out.reason == "CRASH" and "Segmentation fault" in out.feedback, out.feedback
    hang = candidate("        while True:\n            pass\n")
    out = run_in_sandbox(TASK, hang, RunConfig(seeds=(1,), trials=1, warmup=0, timeout=10, inductor=False))
    assert out.reason == "HANG"


def test_the_judges_own_steps_do_not_eat_the_candidates_time() -> None:
    # the candidate's model takes 13 s to build, within the 16 s limit; the judge's start and its
    # input sets take seconds more (5 s and 2.5 s on an idle CPU, twice that on a loaded one, so
    # the limit leaves each judge step room). Charged to one clock, the run was stopped before the
    # candidate was timed (a hang, or the judge's failure) though its own code kept to its limit
    slow_init = candidate(NUMPY + "        return torch.from_numpy((1.0 / (1.0 + np.exp(-a)) * b + 1.0).astype(np.float32))\n",
                          init="        __import__('time').sleep(13.0)\n")
    out = run_in_sandbox(TASK, slow_init, RunConfig(seeds=(1,), trials=1, warmup=0, timeout=16, inductor=False, eager=False))
    assert out.reason == "ACCEPTED", (out.reason, out.feedback)
    seconds = out.phase_seconds or {}
    assert seconds.get("load", 0) >= 13.0 and sum(v for k, v in seconds.items() if ":" not in k) > 16, seconds


def test_larger_inputs_catch_a_kernel_tied_to_one_size() -> None:
    # correct at the task's size only: it hard-codes 64 rows
    source = candidate(NUMPY + "        r = (1.0 / (1.0 + np.exp(-a[:64])) * b[:64] + 1.0).astype(np.float32)\n        return torch.from_numpy(r)\n")
    assert judge(source).reason == "ACCEPTED"
    bigger = judge(source, RunConfig(seeds=(5,), trials=2, warmup=0, timeout=120, inductor=False, grow=2))
    assert bigger.reason == "SHAPE_MISMATCH"


def test_printed_text_cannot_pose_as_a_verdict() -> None:
    fake = '{"stage": "timing", "reason": "ACCEPTED", "kernel_ms": 0.0001, "eager_ms": 1.0}'
    source = candidate(f"        print({fake!r})\n        raise ValueError('no kernel here')\n")
    out = judge(source)
    assert out.reason == "RUNTIME_ERROR"


LAYOUT_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, xt, row):
        return xt * 2.0 + row


def get_inputs():
    # published style: made on the CPU; a transposed view and a stride-0 broadcast
    return [torch.randn(48, 64).t(), torch.randn(48).expand(64, 48)]


def get_init_inputs():
    return []
'''

_LAYOUT_CANDIDATE = (
    "import numpy as np\nimport torch\nimport torch.nn as nn\n\n\n"
    "class ModelNew(nn.Module):\n    def forward(self, xt, row):\n{body}"
)
# numpy reads a tensor through its strides: an honest "kernel"
BY_STRIDES = _LAYOUT_CANDIDATE.format(body="        return torch.from_numpy((xt.numpy() * 2.0 + row.numpy()).astype(np.float32))\n")
# reads every input's memory as if it were a dense row-major array of its shape
AS_DENSE = _LAYOUT_CANDIDATE.format(body=(
    "        def dense(t):\n"
    "            flat = np.lib.stride_tricks.as_strided(t.numpy(), t.shape, (t.shape[1] * 4, 4))\n"
    "            return flat\n"
    "        return torch.from_numpy((dense(xt) * 2.0 + dense(row)).astype(np.float32))\n"))


def test_inputs_arrive_with_the_task_layouts_and_a_stride_ignoring_kernel_is_told_which() -> None:
    out = judge(BY_STRIDES, task=LAYOUT_TASK)
    assert out.reason == "ACCEPTED", out.feedback
    assert out.device == "cpu" and out.memory is not None and out.memory["exact"] == "float64"
    bad = judge(AS_DENSE, task=LAYOUT_TASK)
    assert bad.reason in ("MISMATCH", "NAN_INF"), bad.feedback
    assert "right when every input is contiguous" in bad.feedback
    assert "input 0: shape [64, 48], strides (1, 64)" in bad.feedback
    assert "input 1: shape [64, 48], strides (0, 1)" in bad.feedback


def test_the_judges_own_failure_is_not_the_candidates() -> None:
    broken_task = TASK.replace("return torch.sigmoid(x) * w + 1.0", "raise RuntimeError('the reference itself is broken')")
    out = run_in_sandbox(broken_task, HONEST, FAST)
    assert out.reason == "INFRA" and "reference" in out.feedback, (out.reason, out.feedback)


PROBE = '''
import fcntl


def lock_state(path):
    """'alone' (an exclusive holder), 'shared' (shared holders only) or 'free', as another
    worker would find the GPU lock now."""
    with open(path, "rb") as f:  # (read-only: the candidate's process writes no files)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(f, fcntl.LOCK_UN)
            return "free"
        except BlockingIOError:
            pass
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(f, fcntl.LOCK_UN)
            return "shared"
        except BlockingIOError:
            return "alone"


def note(who):
    """Tells the test, over its datagram socket, who ran and how the lock was held."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto((who + " " + lock_state(LOCK)).encode(), RECORD)
'''


def test_every_run_of_the_candidate_and_the_reference_holds_the_gpu_lock(tmp_path) -> None:
    """Correctness and the replay check run under the GPU lock shared, Inductor's first call
    (which benchmarks its kernels' configurations) and the timing under it exclusively: no
    forward of either side runs while another worker could be timing. Goes red if the replay or
    Inductor's compile runs with the lock free."""
    import dataclasses

    from kevin_backend.judge.sandbox import job_of, run_worker_process

    from datagram_probe import Messages

    lock, record = tmp_path / "gpu0.lock", tmp_path / "record.sock"
    prelude = f"LOCK = {str(lock)!r}\nRECORD = {str(record)!r}\n" + PROBE
    task = TASK.replace("import torch.nn as nn\n", "import torch.nn as nn\n" + prelude, 1).replace(
        "    def forward(self, x, w):\n",
        "    def forward(self, x, w):\n        torch._dynamo.disable(note)('reference')\n", 1)
    source = candidate("        note('candidate')\n" + NUMPY +
                       "        return torch.from_numpy((1.0 / (1.0 + np.exp(-a)) * b + 1.0).astype(np.float32))\n")
    source = source.replace("import torch.nn as nn\n", "import torch.nn as nn\n" + prelude, 1)
    config = RunConfig(seeds=(1, 2), trials=3, warmup=1, timeout=120, gpu_lock=str(lock))
    job = dataclasses.replace(job_of(task, source, config), compile_backend="eager")
    with Messages(record) as messages:
        end = run_worker_process("kevin_backend.judge.run_worker", job, 120)
    assert end.verdict is not None and end.verdict["reason"] == "ACCEPTED", (end.verdict, end.err[-3000:])
    seen = [message.split() for message in messages.received]
    assert ["reference", "free"] not in seen and ["candidate", "free"] not in seen, seen
    candidate_states = [state for who, state in seen if who == "candidate"]
    # correctness (shared), then every timed batch alone: (warm-up + MIN_ROUNDS) rounds of 2 slots on a CPU
    timed = 2 * (MIN_ROUNDS + 1)
    assert candidate_states[-timed:] == ["alone"] * timed and candidate_states[:-timed] == ["shared"] * 2, candidate_states
    # the references' process: its timed batches alone, each round; the references that check a
    # round's outputs (2 calls, eager and float64) with the GPU shared again
    reference_states = [state for who, state in seen if who == "reference"]
    assert reference_states.count("alone") >= timed and reference_states.count("shared") >= 2 * timed, reference_states


def test_the_candidate_and_the_references_are_timed_in_interleaved_rounds_on_fresh_slots() -> None:
    """The job that times the references alternates the candidate, Inductor and eager over the
    rounds, each round on fresh values in the same slots; the notes keep every round's time."""
    out = judge(HONEST, RunConfig(seeds=(1,), trials=3, warmup=1, timeout=120, inductor=True))
    assert out.reason == "ACCEPTED", out.feedback
    notes = " ".join(out.memory["notes"])
    assert f"timed in {MIN_ROUNDS} interleaved rounds of 2 calls on fresh input slots" in notes, notes
    for side in ("kernel", "inductor", "eager"):
        assert len(notes.split(f"{side} ")[1].split(";")[0].split()) == MIN_ROUNDS, notes
    assert out.inductor_ms is not None and out.inductor_ms > 0


def test_slots_are_many_and_cold_where_memory_allows() -> None:
    """MAX_SLOTS slots (a batch's fixed cost spread over many calls), fewer when the judge's memory
    says so, one only where two do not fit; cold (read from memory) only when they cover twice the L2 cache."""
    mb = 1 << 20
    assert plan_slots(4 * mb, 50 * mb, lambda n: True) == (MAX_SLOTS, True)
    assert plan_slots(1 * mb, 50 * mb, lambda n: True) == (MAX_SLOTS, False)
    assert plan_slots(64 * mb, 50 * mb, lambda n: n * 64 * mb <= 256 * mb) == (4, True)
    assert plan_slots(4 * mb, 50 * mb, lambda n: n * 4 * mb <= 40 * mb) == (10, False)
    assert plan_slots(4 * mb, 50 * mb, lambda n: n < 2) == (1, False)  # a set too big for two slots: one
    assert plan_slots(4 * mb, 50 * mb, lambda n: False) == (1, False)  # (its allocation then says RESOURCE)
    assert plan_slots(4 * mb, 0, lambda n: True) == (2, False)  # a CPU: no cache to count, two slots


def test_a_job_crosses_the_wire_as_one_json_line_and_comes_back_the_same() -> None:
    """The parent's `Job` and the worker's are one and the same after the wire (seeds a tuple,
    numerics (name, value) pairs again, the token beside the fields, not among them); a field the
    worker does not know, or a missing required one, is refused rather than ignored."""
    import dataclasses
    import json

    from kevin_backend.judge.job import Job, RetimeJob
    from kevin_backend.judge.sandbox import job_of

    config = RunConfig(seeds=(3, 4), trials=7, warmup=2, grow=2, memory_factor=2.5, gpu_lock="/locks/gpu0.lock",
                       numerics=(("float32_matmul_precision", "high"), ("matmul_tf32", True)))
    job = dataclasses.replace(job_of(TASK, HONEST, config), compile_backend="eager")
    line = job.to_json("t0ken")
    assert "\n" not in line
    wire = json.loads(line)
    assert wire["token"] == "t0ken" and wire["seeds"] == [3, 4]
    assert wire["numerics"] == {"float32_matmul_precision": "high", "matmul_tf32": True}
    assert Job.from_json(line) == (job, "t0ken")
    retime = RetimeJob(task=TASK, kernel=HONEST, rounds=5, trials=3, warmup=1, numerics=(("matmul_tf32", False),))
    assert RetimeJob.from_json(retime.to_json("x")) == (retime, "x")
    # what a parent leaves out takes the job's defaults (a re-timing's seed is the judge's first)
    assert RetimeJob.from_json(json.dumps({"token": "x", "task": TASK, "kernel": HONEST, "rounds": 5, "trials": 3,
                                           "warmup": 1}))[0].seed == 11
    with pytest.raises(TypeError):
        Job.from_json(json.dumps({**wire, "kernel": HONEST}))
    with pytest.raises(TypeError):
        Job.from_json(json.dumps({k: v for k, v in wire.items() if k != "candidate"}))


def test_an_error_only_the_float64_reference_sees_is_a_mismatch() -> None:
    """Every output 8e-5 too large, relatively: beyond the bound against the float64 run (about
    2e-5 |E| + 3e-5 s on this task) for most elements, within KernelBench's tolerance against eager
    (1e-4 (|E| + s)). Only the exact comparison catches it: red when the judge compares with eager."""
    body = NUMPY + "        return torch.from_numpy(((1.0 / (1.0 + np.exp(-a)) * b + 1.0) * (1.0 + 8e-5)).astype(np.float32))\n"
    out = judge(candidate(body))
    assert out.reason == "MISMATCH" and out.exact == "float64", (out.reason, out.exact, out.feedback)


# A candidate that knows the judge's seeds: at load it makes every input set the judge would make
# (the correctness sets, the special one among them, and the timing's slots) with the judge's
# own generator, computes their outputs, and at run time answers from that table, keyed by the
# inputs' bytes; anything it has not seen gets zeros.
MEMORIZER = '''
import numpy as np
import torch
import torch.nn as nn
from kevin_backend.measure.inputs import make_input_set


class _Task:
    @staticmethod
    def get_inputs():
        return [torch.randn(64, 32), torch.randn(64, 32)]


_TABLE = {}
_seeds = [1, 2, 3] + [1 + 7919 * (r + 1) + i for r in range(8) for i in range(2)]
for _seed in _seeds:
    for _r, _special in ((0, False), (6, False), (3, False), (1, False), (0, True)):
        _x, _w = make_input_set(_Task, _seed, "cpu", exponent_range=_r, special=_special).values
        _TABLE[_x.numpy().tobytes() + _w.numpy().tobytes()] = (
            1.0 / (1.0 + np.exp(-_x.numpy())) * _w.numpy() + 1.0).astype(np.float32)


class ModelNew(nn.Module):
    def forward(self, x, w):
        hit = _TABLE.get(x.numpy().tobytes() + w.numpy().tobytes())
        return torch.from_numpy(hit.copy() if hit is not None else np.zeros((64, 32), np.float32))
'''


def test_a_candidate_that_knows_the_seeds_is_caught_when_the_inputs_are_salted() -> None:
    """With the seeds as they are (salt 0), the memorizer is ACCEPTED: every input it is shown it
    made itself. Salted (the judge draws a fresh salt per evaluation), it has seen none of them."""
    known = judge(MEMORIZER)
    salted = judge(MEMORIZER, RunConfig(seeds=(1, 2, 3), trials=5, warmup=1, timeout=120, inductor=False, salt=123_457))
    assert known.reason == "ACCEPTED", (known.reason, known.feedback)
    assert salted.reason == "MISMATCH", (salted.reason, salted.feedback)
