"""The builder's slots (`toolchain/build.py`, `BuildSlots`): a turn's own build is never queued
behind builds ahead of their turn. A search of eight tasks foresees dozens of programs; with one
pool of slots, each task's next turn waited for a build of about a minute before its own began."""

from __future__ import annotations

import threading
import time

from kevin_backend.toolchain.build import FOREGROUND_SLOTS, BuildSlots


class Holder:
    """A thread that takes a slot, says so, and holds it until released."""

    def __init__(self, slots: BuildSlots, background: bool, order: list[str], name: str) -> None:
        self.took = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(slots, background, order, name), daemon=True)
        self.thread.start()

    def _run(self, slots: BuildSlots, background: bool, order: list[str], name: str) -> None:
        with slots.taken(background):
            order.append(name)
            self.took.set()
            self.release.wait(10)

    def end(self) -> None:
        self.release.set()
        self.thread.join(10)


def end_all(holders: list[Holder]) -> None:
    for holder in holders:  # (all released first: a holder may wait for another's slot)
        holder.release.set()
    for holder in holders:
        holder.thread.join(10)


def _settle(slots: BuildSlots, running: int, waiting: int = 0) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if slots.counts()[0] == running and slots.counts()[2] == waiting:
            return
        time.sleep(0.005)
    raise AssertionError(f"slots never reached {running} running, {waiting} waiting: {slots.counts()}")


def test_builds_ahead_leave_slots_for_a_turns_own_build() -> None:
    slots = BuildSlots(4)
    assert slots.ahead_limit == 4 - FOREGROUND_SLOTS == 2
    order: list[str] = []
    ahead = [Holder(slots, True, order, f"ahead{k}") for k in range(5)]
    for holder in ahead[:2]:
        assert holder.took.wait(5)
    time.sleep(0.1)
    assert slots.counts() == (2, 2, 0) and sum(h.took.is_set() for h in ahead) == 2  # the other three wait
    own = [Holder(slots, False, order, f"own{k}") for k in range(2)]
    assert all(h.took.wait(5) for h in own)  # at once: two slots were left for them
    assert slots.counts() == (4, 2, 0)
    end_all(ahead + own)
    _settle(slots, 0)
    assert sorted(order) == sorted(f"ahead{k}" for k in range(5)) + ["own0", "own1"]


def test_a_waiting_turns_build_takes_the_next_free_slot_before_any_build_ahead() -> None:
    slots = BuildSlots(2)  # (one build ahead at most: a builder of two slots)
    order: list[str] = []
    first_ahead = Holder(slots, True, order, "ahead0")
    assert first_ahead.took.wait(5)
    own0 = Holder(slots, False, order, "own0")
    assert own0.took.wait(5)
    late_ahead = Holder(slots, True, order, "ahead1")
    time.sleep(0.05)
    own1 = Holder(slots, False, order, "own1")
    _settle(slots, 2, waiting=1)  # own1 waits; ahead1 waits too
    first_ahead.end()
    assert own1.took.wait(5)
    time.sleep(0.05)
    assert not late_ahead.took.is_set()  # both slots are turns' builds now
    own0.end()
    assert late_ahead.took.wait(5)
    assert order == ["ahead0", "own0", "own1", "ahead1"]
    end_all([late_ahead, own1])
    _settle(slots, 0)


def test_a_turns_build_wins_the_freed_slot_over_many_builds_ahead_waiting() -> None:
    """Twenty builds ahead and one turn's build wait for a full builder; each time a slot frees,
    the turn's build takes it (without the rule, one chance in 21 each time)."""
    slots = BuildSlots(2, reserved=0)
    order: list[str] = []
    holders = [Holder(slots, False, order, f"own{k}") for k in range(2)]
    assert all(h.took.wait(5) for h in holders)
    ahead = [Holder(slots, True, order, f"ahead{k}") for k in range(20)]
    time.sleep(0.1)
    for round_ in range(3):
        mine = Holder(slots, False, order, f"turn{round_}")
        _settle(slots, 2, waiting=1)
        holders.pop(0).end()
        assert mine.took.wait(5)
        assert [name for name in order if not name.startswith("own")] == [f"turn{k}" for k in range(round_ + 1)], order
        holders.append(mine)
    end_all(holders + ahead)
    _settle(slots, 0)
    assert len(order) == 2 + 3 + 20


def test_a_builder_of_one_slot_still_builds_ahead() -> None:
    slots = BuildSlots(1)
    assert slots.ahead_limit == 1
    order: list[str] = []
    ahead = Holder(slots, True, order, "ahead")
    assert ahead.took.wait(5)
    ahead.end()
    _settle(slots, 0)
