"""A policy that replays scripted replies: for tests, demos and reproducing a logged search.

    policy = ReplayPolicy(["reply for turn 0", "reply for turn 1", ...])
    policy = ReplayPolicy.from_file("replies.json")     # a JSON list of strings, or a trajectory
                                                         # log (.jsonl): its replies in order

Every conversation of the n-th call gets the n-th scripted reply (or, with `per_conversation`,
reply lists per conversation). The conversations it was sent are kept in `received`, so a test
can check exactly what the loop fed back at each turn. When the script runs out the policy
raises PolicyError, as a server that went away would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from kevin_backend.generate.policy import Message, PolicyError, Reply, Sampling, split_reasoning

__all__ = ["ReplayPolicy"]


class ReplayPolicy:
    def __init__(self, replies: Sequence[str] | Sequence[Sequence[str]], per_conversation: bool = False,
                 name: str = "replay") -> None:
        self.name = name
        self.per_conversation = per_conversation
        self.replies = [list(r) for r in replies] if per_conversation else list(replies)
        self.calls = 0
        self.received: list[list[list[Message]]] = []

    @classmethod
    def from_file(cls, path: Path) -> "ReplayPolicy":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyError(f"cannot read the replay file {path}: {exc.strerror or exc}") from exc
        if path.suffix == ".jsonl":
            lines = [json.loads(line) for line in text.splitlines() if line.strip()]
            lines.sort(key=lambda d: (d.get("turn", 0), d.get("trajectory", 0)))
            replies = [d["reply"] for d in lines if d.get("trajectory", 0) == 0]
        else:
            replies = json.loads(text)
        if not isinstance(replies, list) or not all(isinstance(r, str) for r in replies):
            raise PolicyError(f"{path}: expected a JSON list of reply strings (or a trajectory log .jsonl)")
        return cls(replies, name=f"replay:{path.name}")

    def generate(self, conversations: Sequence[Sequence[Message]], sampling: Sampling) -> list[Reply]:
        self.received.append([list(c) for c in conversations])
        turn = self.calls
        self.calls += 1
        out = []
        for i, _ in enumerate(conversations):
            script = self.replies[i % len(self.replies)] if self.per_conversation else self.replies
            if turn >= len(script):
                raise PolicyError(f"the replay script has {len(script)} replies; turn {turn + 1} asked for another")
            answer, reasoning = split_reasoning(script[turn])  # type: ignore[arg-type]
            out.append(Reply(answer, reasoning, completion_tokens=len(str(script[turn])) // 4))
        return out
