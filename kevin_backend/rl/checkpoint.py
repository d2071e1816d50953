"""Checkpoints that resume a run exactly.

A checkpoint is a folder `<run_dir>/checkpoints/batch-000012/` holding:

* what `accelerate` saves: the model's weights (or, under DeepSpeed/FSDP, each process's shard),
  the optimizer's state, the registered objects (the learning-rate scheduler), and every
  process's RNG states (python `random`, numpy, torch, CUDA);
* `trainer_state.json`: the batches and optimizer steps done, the task sampler's position (data
  order), the config's digest, and whether the warm start (`sft.py`) was done.

Rollouts draw from seeds fixed by (run seed, batch, task), and the RNG states come back with the
weights and the optimizer, so a resumed run takes the same next step as the run that was
interrupted (bit for bit on a CPU). A checkpoint is written to `<name>.partial` and renamed when
complete, so a crash while saving never leaves a half checkpoint that looks whole.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["TrainerState", "checkpoint_path", "latest_checkpoint", "save_checkpoint", "load_checkpoint",
           "export_model", "STATE_FILE"]

STATE_FILE = "trainer_state.json"
_NAME = re.compile(r"^batch-(\d{6,})$")


@dataclass(frozen=True)
class TrainerState:
    batch: int = 0  # batches finished
    optimizer_step: int = 0
    sampler: dict[str, Any] = field(default_factory=dict)
    config_digest: str = ""
    sft_done: bool = False  # the warm start (config section sft) ran: a resumed run skips it
    sft_steps: int = 0  # its optimizer steps (not counted in optimizer_step)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainerState":
        return cls(int(data["batch"]), int(data["optimizer_step"]), dict(data.get("sampler") or {}),
                   str(data.get("config_digest", "")), bool(data.get("sft_done", False)),
                   int(data.get("sft_steps", 0)))


def checkpoint_path(run_dir: Path, batch: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"batch-{batch:06d}"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint of `run_dir` with the most batches (None when there is none)."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in folder.iterdir()
             if (m := _NAME.match(p.name)) and (p / STATE_FILE).is_file()]
    return max(found)[1] if found else None


def save_checkpoint(accelerator: Any, run_dir: Path, state: TrainerState, keep: int) -> Path:
    """Save everything needed to resume after `state.batch` batches; keep the newest `keep`."""
    final = checkpoint_path(run_dir, state.batch)
    partial = final.with_name(final.name + ".partial")
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(partial))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (partial / STATE_FILE).write_text(json.dumps(asdict(state), indent=1))
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        _prune(Path(run_dir), keep)
    accelerator.wait_for_everyone()
    return final


def _prune(run_dir: Path, keep: int) -> None:
    folder = run_dir / "checkpoints"
    complete = sorted((int(m.group(1)), p) for p in folder.iterdir()
                      if (m := _NAME.match(p.name)) and (p / STATE_FILE).is_file())
    for _, path in complete[:-keep]:
        shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(accelerator: Any, folder: Path) -> TrainerState:
    """Restore weights, optimizer, scheduler and RNG states from `folder`; return the trainer's state."""
    folder = Path(folder)
    state_file = folder / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{folder} is not a complete checkpoint (no {STATE_FILE})")
    accelerator.load_state(str(folder))
    return TrainerState.from_dict(json.loads(state_file.read_text()))


def export_model(accelerator: Any, model: Any, tokenizer: Any, folder: Path) -> Path:
    """The trained model as a `from_pretrained` folder (LoRA: the adapter only), for serving it
    (`vllm serve`, `kevin generate --policy hf:FOLDER`)."""
    folder = Path(folder)
    state_dict = accelerator.get_state_dict(model)  # gathered from every shard
    unwrapped = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        folder.mkdir(parents=True, exist_ok=True)
        unwrapped.save_pretrained(str(folder), state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(str(folder))
    accelerator.wait_for_everyone()
    return folder
