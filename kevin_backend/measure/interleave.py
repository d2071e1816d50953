"""Interleaved timing: several things measured round by round under the one timer, so that slow
drift falls on all of them alike (`kevin bench`'s compilers, the judge's candidate and Inductor,
the re-timing's kernel and Inductor, the graph check's variants).

One protocol for everything the project times: `kevin_backend.measure.timer.make_timer` (warm-up,
then trials each timed with CUDA events between device-wide synchronizations, the L2 cache
flushed before each trial, the median counts; on a CPU, `time.perf_counter` around each trial).
`interleaved` measures several variants round by round, rotating which goes first, so that slow
drift (clocks, temperature, other tenants) falls on every variant alike; by default the variants
also alternate call by call inside a round, so that drift faster than a round (a launch-bound step
on a shared machine moved between two levels 1.6x apart within seconds) falls on them alike too.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Mapping, Sequence

import torch

from kevin_backend.measure.timer import make_timer

__all__ = ["Measure", "INTERLEAVE", "timer", "measure_ms", "round_order", "interleaved", "interleaved_rounds"]

Measure = Callable[[Callable[[], Any]], float]

# How the variants alternate: "call" (inside each round, one timed call of each in turn),
# "round" (each variant's calls of a round back to back).
INTERLEAVE = ("call", "round")


def timer(device: str | torch.device, trials: int = 10, warmup: int = 3) -> Measure:
    """A function `measure(fn) -> median milliseconds of fn()` under the judge's protocol.

    Make one per process and device: on CUDA it holds the buffer written to flush L2.
    """
    if trials < 1 or warmup < 0:
        raise ValueError(f"need trials >= 1 and warmup >= 0, got {trials} and {warmup}")
    return make_timer(torch.device(device), trials, warmup)


def measure_ms(fn: Callable[[], Any], device: str | torch.device, trials: int = 10, warmup: int = 3) -> float:
    """Median milliseconds of `fn()` (a one-off: `timer` once for several functions)."""
    return timer(device, trials, warmup)(fn)


def round_order(names: list[str], round_index: int) -> list[str]:
    """The order of round `round_index`: rotated by one each round, reversed every other cycle,
    so over 2 x len(names) rounds each variant runs in every position, after every other one."""
    k = round_index % len(names)
    order = names[k:] + names[:k]
    if (round_index // len(names)) % 2:
        order.reverse()
    return order


def interleaved(
    fns: Mapping[str, Callable[[], Any]],
    device: str | torch.device | None,
    rounds: int,
    trials: int = 10,
    warmup: int = 3,
    measure: Measure | None = None,
    warmup_rounds: int = 0,
    until: Callable[[Mapping[str, Sequence[float]]], bool] | None = None,
    max_rounds: int | None = None,
    interleave: str = "round",
    rotate: bool = True,
) -> dict[str, tuple[float, ...]]:
    """Per variant, the median ms of each round, variants alternating, after `warmup_rounds`
    whole rounds whose times are dropped (the first round after compiling runs slow: allocator,
    caches, clocks). `rounds` rounds; with `until`, more rounds after those, one at a time, until
    `until(samples so far)` is true or `max_rounds` rounds are done.

    `interleave="round"`: a round is `measure(fn)` of each variant in turn (`measure` defaults to
    the protocol with `trials` and `warmup`). `interleave="call"`: a round warms each variant up
    `warmup` times, then times `trials` calls of each, one call of each variant in turn (the order
    rotating call by call), and counts each variant's median; `measure` then times one call.
    `rotate=False` keeps the order of `fns` in every round."""
    if rounds < 1 or warmup_rounds < 0 or trials < 1 or warmup < 0:
        raise ValueError(f"need rounds >= 1, warmup_rounds >= 0, trials >= 1, warmup >= 0; got {rounds}, {warmup_rounds}, "
                         f"{trials}, {warmup}")
    if interleave not in INTERLEAVE:
        raise ValueError(f"interleave must be one of {', '.join(INTERLEAVE)}, got {interleave!r}")
    last = max(rounds, max_rounds or rounds) if until is not None else rounds
    by_call = interleave == "call"
    if measure is None:
        if device is None:
            raise ValueError("interleaved needs a device to time on, or a `measure` of its own")
        measure = timer(device, 1, 0) if by_call else timer(device, trials, warmup)
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    r = -warmup_rounds
    while r < last:
        if r >= rounds and until(samples):  # type: ignore[misc]  (r >= rounds only with `until`)
            break
        order = round_order(names, r) if rotate else names
        if by_call:
            got = _call_by_call(fns, order, trials, warmup, measure)
        else:
            got = {name: measure(fns[name]) for name in order}
        if r >= 0:
            for name in names:
                samples[name].append(got[name])
        r += 1
    return {n: tuple(v) for n, v in samples.items()}


def _call_by_call(fns: Mapping[str, Callable[[], Any]], order: list[str], trials: int, warmup: int,
                  measure: Measure) -> dict[str, float]:
    """One round of `interleaved(interleave="call")`: each variant's median over `trials` calls,
    the variants taking turns call by call."""
    for _ in range(warmup):
        for name in order:
            fns[name]()
    times: dict[str, list[float]] = {n: [] for n in order}
    for t in range(trials):
        for name in round_order(order, t):
            times[name].append(measure(fns[name]))
    return {n: statistics.median(v) for n, v in times.items()}


def interleaved_rounds(kernel: Callable[[], float], inductor: Callable[[], float],
                       rounds: int) -> tuple[list[float], list[float]]:
    """`rounds` rounds of kernel then Inductor (A B A B ...): each call measures one side once
    (a median of several trials) and returns milliseconds. The two lists are paired by round."""
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    got = interleaved({"kernel": kernel, "inductor": inductor}, None, rounds, measure=lambda side: float(side()),
                      rotate=False)
    return list(got["kernel"]), list(got["inductor"])
