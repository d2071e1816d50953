"""The timing phase of a judged run, kept by the judge's clock, with the candidate in its own
process and the references in another process of the judge's (so both sides are called the same
way: a message, the calls back to back, the device synchronised, the reply).

What a time is: the wall-clock time of a batch of calls, one per input slot, divided by the
calls. The slots are input sets in memory the judge owns (`shared_values.Arena`), refilled with
fresh values from the task's own generator before every round (`fill`), so no call sees values it
has seen before: a result cached by pointer or by a few elements is never right. 32 slots rotate
where memory allows (`plan_slots`), so a batch's fixed cost is spread over many calls and, for any
task above 4 MB, the slots are twice the GPU's L2 cache: the calls read from memory, and a time
faster than copying the task's own bytes at 1.1x the GPU's copy bandwidth is impossible, and
rejected.

Every round, two calls of the candidate's batch, chosen by the judge in secret, are read back at
once and compared with the reference on their inputs, and read again later: an output that is
wrong, or not yet written when the batch said it was done, or still changing after, fails the
candidate (work left running on any stream counts: the reply must come after it). The inputs of
the chosen calls are copied into the judge's own memory before the batch, and the references run
on those copies: values the candidate's process writes into the shared slots after its reply
(to make a wrong output look right) never reach a reference. The slots are
fingerprinted before and after the candidate's batch (an input changed fails it), and one random
call per batch runs under the dispatch audit.

Only the batches hold the GPU alone (the judge's GPU lock, exclusive): filling the slots and
checking a round share it with other workers' correctness runs, so several workers judging at
once queue for the GPU only for the milliseconds their batches take.
"""

from __future__ import annotations

import math
import secrets
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from kevin_backend.judge.attribution import Verdict, error
from kevin_backend.judge.judged_run import Run
from kevin_backend.judge.roofline_phase import measured_copy_bandwidth
from kevin_backend.judge.shared_values import Arena, arena_bytes, place, views_at
from kevin_backend.locks import gpu_hold
from kevin_backend.measure.compare import compare_outputs
from kevin_backend.measure.inputs import InputSet, fingerprint, make_input_set
from kevin_backend.measure.memory import candidate_workspace
from kevin_backend.measure.roofline import task_bytes

__all__ = ["IMPOSSIBLE_FACTOR", "MAX_SLOTS", "MIN_ROUNDS", "CandidateTimes", "Slots", "fill", "make_slots", "plan_slots",
           "same_bits", "slot_bytes", "slot_memory", "time_candidate", "timed_batch", "timed_output_wrong"]

MAX_SLOTS = 32
MIN_ROUNDS = 5
IMPOSSIBLE_FACTOR = 1.1  # a kernel above this multiple of the copy bandwidth of its own bytes
CHECKED_CALLS = 2  # calls of each timed batch checked: at least one is not the audited one


@dataclass(frozen=True)
class CandidateTimes:
    """What the timing phase measured."""

    seed: int  # the seed of a set of the task's own values (the roofline's bytes are counted on it, made again)
    kernel_ms: float
    eager_ms: float | None  # None when this job does not time the references (the judge keeps their times)
    inductor_ms: float | None
    copy_gbps: float | None  # the GPU's copy bandwidth; None on a CPU or when measuring it failed
    cold: bool = False  # the slots were twice the L2 cache: times are from memory


@dataclass
class Slots:
    """The rotating input sets of the timing, in one arena of the judge's."""

    arena: Arena
    count: int
    stride: int  # bytes between slots
    cold: bool
    descs: list[list[dict[str, Any]]] = field(default_factory=list)
    views: list[list[Any]] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    # the judge's copies of the checked calls' inputs: CHECKED_CALLS regions of `stride` bytes, each
    # a tensor of its own storage, never shared (on a GPU outside torch's caching allocator, so the
    # judge's memory bound counts them with the slots, not with the judge's own extra)
    private: list[torch.Tensor] = field(default_factory=list)
    private_buffer: Any = None

    def close(self) -> None:
        """Frees the private copies' memory and lets go of the arena (freed once the processes it
        was shared with are gone too)."""
        self.private = []
        if self.private_buffer is not None:
            self.private_buffer.free()
            self.private_buffer = None
        if self.arena is not None:
            self.arena.release()
            self.arena = None  # type: ignore[assignment]


def plan_slots(set_bytes: int, l2_bytes: int, memory_ok: Any) -> tuple[int, bool]:
    """(how many slots, whether they are cold): MAX_SLOTS, so that a batch's fixed cost (the
    message's round trip, the device's synchronisation) is spread over many calls, fewer when
    `memory_ok(count)` says so; one only when two do not fit (a set of a sizeable part of the GPU,
    whose every call is long beside a batch's fixed cost, and fresh in every round); cold when
    together they are at least twice the L2 cache. A CPU has no cache to count: two slots, never
    cold."""
    if not l2_bytes:
        return 2, False  # a CPU (the tests' form of the judge): two slots rotate
    count = MAX_SLOTS
    while count > 1 and not memory_ok(count):
        count -= 1
    return count, bool(l2_bytes) and count * set_bytes >= 2 * l2_bytes


def slot_memory(device: torch.device) -> int:
    """Memory the timing's slots may take beyond the judge's bound: enough calls per batch that
    the message's round trip is a small share of each call's time, within an eighth of what the
    device has free and 4 GiB."""
    if device.type != "cuda":
        return 0
    free, _ = torch.cuda.mem_get_info(device)
    return min(free // 8, 4 << 30)


def make_slots(stride: int, device: torch.device, folder: Any, memory_ok: Any, private: bool = True,
               reuse: Arena | None = None) -> Slots:
    """An arena of the judge's for as many slots as `plan_slots` says, `stride` bytes each (an input
    set's `arena_bytes`), and (`private`) the judge's regions for the checked calls' inputs.
    `memory_ok(count, judge_bytes)`: whether `count` slots fit, the judge's new memory for them
    being `judge_bytes`. An arena already shared (`reuse`, the candidate's own for its correctness
    calls) holds the slots when they fit in it: no new memory for them."""
    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0) if device.type == "cuda" else 0
    # (the judge's private copies of the checked calls' inputs come out of the same memory)
    copies = (lambda count: min(CHECKED_CALLS, count)) if private else (lambda count: 0)

    def arena_for(count: int) -> int:
        return 0 if reuse is not None and count * stride <= reuse.nbytes else count * stride

    count, cold = plan_slots(stride, l2, lambda count: memory_ok(count, arena_for(count) + copies(count) * stride))
    if arena_for(count):
        arena = Arena(count * stride, device, folder, apart="slots")
    else:
        arena = reuse
        arena.hold()  # type: ignore[union-attr]
    slots = Slots(arena, count, stride, cold)  # type: ignore[arg-type]
    try:
        if device.type == "cuda" and copies(count):
            from kevin_backend.judge.cuda_ipc import DeviceBuffer, tensor_at

            region = max(stride, 256)
            slots.private_buffer = DeviceBuffer(copies(count) * region, device, share=False, apart="slots")
            slots.private = [tensor_at(slots.private_buffer.pointer + k * region, stride, device) for k in range(copies(count))]
        else:
            slots.private = [torch.empty(stride, dtype=torch.uint8) for _ in range(copies(count))]
    except BaseException:
        slots.close()
        raise
    return slots


def fill(task: Any, base_seed: int, device: torch.device, slots: Slots, round_index: int) -> None:
    """Fresh values from the task's own generator into every slot (new seeds every round)."""
    slots.descs, slots.views, slots.seeds = [], [], []
    for i in range(slots.count):
        seed = base_seed + 7919 * (round_index + 1) + i
        values = make_input_set(task, seed, device).values
        descs, views = place(values, slots.arena, i * slots.stride)
        slots.descs.append(descs)
        slots.views.append(views)
        slots.seeds.append(seed)
    _sync(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_batch(device: torch.device, remote: Any, slots: Slots, entry: str, audit: list[int]) -> tuple[float, dict[str, Any]]:
    """One batch on `remote`: (milliseconds per call by the judge's clock, the reply)."""
    _sync(device)
    start = time.perf_counter()
    reply = remote.request({"op": "batch", "calls": slots.descs, "audit": audit, "entry": entry}, "the timed calls")
    ms = (time.perf_counter() - start) * 1000.0 / slots.count
    return ms, reply


def slot_bytes(slots: Slots) -> list[torch.Tensor]:
    """Every slot's bytes as one region (its padding too: a write there is a write out of bounds),
    hashed in one pass."""
    return [slots.arena.tensor[:slots.count * slots.stride].view(torch.int64)]


def _private_inputs(slots: Slots, k: int, j: int) -> InputSet:
    """Slot `j`'s inputs copied into the judge's private region `k` (the candidate's process can
    write into the shared slots at any time; it cannot reach this copy)."""
    memory = slots.private[k]
    memory.copy_(slots.arena.tensor[j * slots.stride:(j + 1) * slots.stride])
    return InputSet(views_at(slots.descs[j], memory, j * slots.stride), slots.seeds[j], 0)


def _read_round(run: Run, slots: Slots, reply: dict[str, Any], chosen: Any) -> dict[int, list[Any]]:
    """The chosen calls' outputs, read at once: {call: outputs}."""
    outputs = reply.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != slots.count:
        raise Verdict(error("RUNTIME_ERROR", "timing", "the timed calls did not report one output per call"))
    run.phase("timed-read")
    return {j: run.model.read(outputs[j], "a timed call") for j in chosen}


def _check_round(run: Run, slots: Slots, reply: dict[str, Any], got: dict[int, list[Any]], kept: dict[int, InputSet],
                 before: tuple[int, ...]) -> None:
    """The outputs read at once compared with the reference on their inputs (the judge's copies),
    and read again; the inputs unchanged; the audited call computed nothing."""
    outputs = reply["outputs"]
    run.phase("fingerprint")
    if fingerprint(slot_bytes(slots)) != before:
        raise Verdict(error("INPUT_MUTATED", "timing", "a timed call changed its inputs"))
    computed = reply.get("computed") or []
    if computed:
        raise Verdict(error("PYTORCH_COMPUTE", "run", "forward ran PyTorch compute ops: " + ", ".join(map(str, computed[:10]))))
    from kevin_backend.judge.reference_sets import run_eager, run_exact

    for j in list(got):  # one at a time, each call's outputs and references let go before the next
        run.phase("timed-reference")
        want = run_eager(run, kept[j])
        exact = None
        if _exact_fits(run, kept[j], want):
            exact = run_exact(run, kept[j], run.state.exact_model if run.state is not None else [])
        run.phase("timed-compare")
        wrong = timed_output_wrong(run.model, outputs[j], got.pop(j), want, exact, j, run.precision)
        del want, exact
        if wrong:
            raise Verdict(error("REPLAYED_OUTPUT", "timing", wrong))


def _exact_fits(run: Run, inputs: InputSet, want: list[Any]) -> bool:
    """Whether the exact reference of a checked call fits the judge's bound now (beside the other
    checked calls' outputs, read at once after the batch); where it does not, the call is compared
    with eager alone, which tells a stale output as well (`replay_check.stale`), noted once."""
    from kevin_backend.judge.reference_sets import exact_bytes

    if run.exact_dtype is None:
        return False
    sizes = exact_bytes(run, inputs, want, max(0, run.reference_temps), run.exact_dtype)
    if sizes is None or run.ledger.fits(sizes[0]):
        return True
    note = "timed calls checked against eager alone: their exact reference would not fit the judge's memory beside them"
    if note not in run.ledger.notes:
        run.ledger.notes.append(note)
    return False


def timed_output_wrong(remote: Any, desc: Any, got: list[Any], want: list[Any], exact: list[Any] | None,
                       j: int, precision: Sequence[torch.dtype | None] | None = None) -> str:
    """Why timed call `j`'s output (`got`, read at once after the reply) fails, or "": wrong
    beyond rounding on its fresh inputs (`precision`: as `compare_outputs` takes it), or changed
    when read again (work still running)."""
    from kevin_backend.judge.replay_check import mismatch_text, stale

    bad = compare_outputs(got, want, exact, precision=precision)
    if bad is not None and stale(bad, stand_in=exact is None):
        return (f"timed call {j} of a batch returned a wrong output (its inputs were fresh values): it does not "
                f"compute every call ({mismatch_text(bad)})")
    again = remote.read(desc, "a timed call", copy=False)  # (compared where it lies: no second copy)
    if not all(same_bits(a, b) for a, b in zip(got, again)):
        return f"timed call {j}'s output changed after the batch reported it done: work was still running when the calls returned"
    return ""


def _choose(count: int, k: int) -> list[int]:
    """`k` distinct calls (all when there are fewer), chosen by the judge (secrets: unpredictable)."""
    pool = list(range(count))
    return [pool.pop(secrets.randbelow(len(pool))) for _ in range(min(k, count))]


def same_bits(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))
    return bool(a == b)


def time_candidate(run: Run) -> CandidateTimes:
    """The candidate's time and, when this job times them, the references' (eager, Inductor),
    in interleaved rounds on the same fresh slots; see the module's docstring."""
    job = run.job
    seed = job.input_seed(job.seeds[0])
    with gpu_hold(job.gpu_lock, shared=True):
        run.phase("inputs")
        sample = make_input_set(run.task, seed, run.device)
        stride, nbytes = arena_bytes(sample.values), task_bytes(sample.values, [])
        del sample  # (its layout and size are what the slots need; fresh values fill them)
        # (the slots' memory has an allowance of its own, not the judge's bound: `note_outside`)
        slots = make_slots(stride, run.device, run.model.folder, _memory_ok(run, stride), reuse=run.model.scratch)
        try:
            run.model.share(slots.arena)
            if run.device.type == "cuda":
                run.model.give_back_cache()  # the slots made: what the references' sets left cached
        except BaseException:
            slots.close()
            raise
    sides: list[tuple[str, Any, str]] = [("kernel", run.model, "model")]
    reference = None
    times: dict[str, list[float]] = {}
    rounds = max(MIN_ROUNDS, math.ceil(job.trials / slots.count))
    try:
        if job.inductor or job.eager:
            run.phase("reference-process")
            reference = run.start_reference()
            reference.share(slots.arena)
            if job.inductor:
                sides.append(("inductor", reference, "inductor"))
            if job.eager:
                sides.append(("eager", reference, "eager"))
        times.update({name: [] for name, _, _ in sides})
        with torch.no_grad():
            for index in range(rounds + 1):  # round 0 warms up (and compiles Inductor in its process)
                _timed_round(run, slots, sides, index, times)
            run.phase("lock")
            with gpu_hold(job.gpu_lock, shared=False):  # a measurement of the GPU: alone
                copy_gbps = measured_copy_bandwidth(run)
    finally:
        if reference is not None:
            reference.close()
        slots.close()
    medians = {name: statistics.median(values) for name, values in times.items()}
    run.ledger.notes.append(
        f"timed in {rounds} interleaved rounds of {slots.count} calls on fresh input slots"
        f" ({'cold: twice the L2 cache' if slots.cold else 'within the L2 cache'}); per-call ms by round: "
        + "; ".join(f"{name} {' '.join(f'{v:.4f}' for v in values)}" for name, values in times.items()))
    _impossible(run, nbytes, medians["kernel"], copy_gbps, slots.cold)
    return CandidateTimes(seed, medians["kernel"], medians.get("eager"), medians.get("inductor"), copy_gbps, slots.cold)


def _memory_ok(run: Run, stride: int) -> Any:
    """Whether `count` slots fit (`make_slots`' `memory_ok`): the judge's new memory for them
    within its bound and, with what is held beside it during a round, the device's free memory;
    or all of it within `slot_memory`. Beside: a fresh set made before it is placed, the batch's
    outputs in the candidate's process and in the references' (one per slot each), the judge's
    copies of the checked calls' outputs and the references' (exact too) on their inputs, and the
    candidate's workspace."""
    out = sum(run.output_bytes)
    workspace = candidate_workspace(run.ledger.task_bytes)

    def ok(count: int, judge_bytes: int) -> bool:
        beside = stride + 2 * count * out + (CHECKED_CALLS + 3) * out + workspace
        return run.ledger.fits(judge_bytes, beside) or judge_bytes + beside <= slot_memory(run.device)

    return ok


def _timed_round(run: Run, slots: Slots, sides: list[tuple[str, Any, str]], index: int,
                 times: dict[str, list[float]]) -> None:
    """One round: fresh values in every slot; each side's batch with the GPU held alone (the
    judge's GPU lock, exclusive), the kernel's outputs read at once; then, with the GPU shared
    again (other workers' correctness runs may use it), the kernel's round checked."""
    job = run.job
    with gpu_hold(job.gpu_lock, shared=True):
        run.phase("inputs")
        fill(run.task, job.input_seed(job.seeds[0]), run.device, slots, index)
        run.phase("fingerprint")
        before = fingerprint(slot_bytes(slots))
        chosen = _choose(slots.count, CHECKED_CALLS)  # (in secret: nothing of it reaches the candidate)
        kept = {j: _private_inputs(slots, k, j) for k, j in enumerate(chosen)}
    order = sides[index % len(sides):] + sides[:index % len(sides)]
    run.phase("lock")  # waiting for the GPU alone: the judge's step, whatever the wait
    with gpu_hold(job.gpu_lock, shared=False):
        for name, remote, entry in order:
            run.phase("timing-candidate" if name == "kernel" else "timing-reference")
            audit = [secrets.randbelow(slots.count)] if name == "kernel" else []
            ms, reply = timed_batch(run.device, remote, slots, entry, audit)
            if name == "kernel":
                run.candidate_ran = True
                kernel_reply, got = reply, _read_round(run, slots, reply, chosen)
            elif "how" in reply and not index:
                run.ledger.notes.append(f"Inductor timed as {reply['how']}")
            if index:
                times[name].append(ms)
    with gpu_hold(job.gpu_lock, shared=True):
        _check_round(run, slots, kernel_reply, got, kept, before)


def _impossible(run: Run, input_nbytes: int, kernel_ms: float, copy_gbps: float | None, cold: bool) -> None:
    """Faster than copying the task's own bytes at IMPOSSIBLE_FACTOR x the copy bandwidth, from
    memory: not a kernel computing the task."""
    if not cold or not copy_gbps or kernel_ms <= 0:
        return
    nbytes = input_nbytes + sum(run.output_bytes)
    floor_ms = nbytes / (IMPOSSIBLE_FACTOR * copy_gbps * 1e6)
    if kernel_ms < floor_ms:
        raise Verdict(error("SUSPICIOUS_SPEEDUP", "timing", f"{kernel_ms:.4f} ms is faster than copying the task's "
                            f"{nbytes / 1e6:.1f} MB at {IMPOSSIBLE_FACTOR}x the GPU's copy bandwidth ({copy_gbps:.0f} GB/s: "
                            f"{floor_ms:.4f} ms): it cannot have read its inputs and written its outputs"))
