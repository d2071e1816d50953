"""`kevin train --config FILE`: train the kernel writer with multi-turn GRPO on the judge's rewards;
`kevin train plot RUN_DIR`: draw a run's curves into a PNG.

    kevin train --config configs/train/tiny.yaml --set model.path=runs/tiny-lm
    accelerate launch --config_file configs/accelerate/deepspeed_zero3.yaml \\
        -m kevin_backend train --config configs/train/kevin32b-8gpu.yaml
    kevin train plot runs/tiny                      # -> runs/tiny/metrics.png

A run continues from the newest checkpoint in its run_dir unless `--resume never` is given. A
`model.path` that names a local folder which is not there is a usage error naming the folder and,
for the shipped configs, the command that builds it (before anything is loaded or downloaded).
Exit codes: 0 done, 1 the run failed, 2 usage error (a bad config, a missing file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kevin_backend.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from kevin_backend.config import Config

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("train", parents=parents, help="train the kernel writer (multi-turn GRPO)",
                              description="Train the kernel-writing model on the judge's rewards.")
    p.add_argument("--config", type=Path, help="training config (YAML), e.g. configs/train/tiny.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set optim.lr=2e-6 (repeatable)")
    p.add_argument("--resume", default="auto", metavar="auto|never|CHECKPOINT",
                   help="auto: the newest checkpoint in run_dir, if any (default); never; or a checkpoint folder")
    p.add_argument("--batches", type=int, help="stop after this many batches in all (default: the config's)")
    p.set_defaults(handler=_train)
    actions = p.add_subparsers(title="actions", metavar="ACTION")
    plot = actions.add_parser("plot", parents=parents, help="draw a run's metrics into a PNG")
    plot.add_argument("run_dir", type=Path, help="the run's folder (holds metrics.jsonl)")
    plot.add_argument("--out", type=Path, help="the PNG to write (default: RUN_DIR/metrics.png)")
    plot.set_defaults(handler=_plot)


def _train(args: argparse.Namespace, config: Config) -> int:
    from kevin_backend.rl.train_config import TrainConfig, TrainConfigError

    if args.config is None:
        raise CommandError("kevin train needs --config FILE (see configs/train/), or the action `plot RUN_DIR`",
                           EXIT_USAGE)
    if args.batches is not None and args.batches < 1:
        raise CommandError(f"--batches must be at least 1, got {args.batches}", EXIT_USAGE)
    try:
        train_config = TrainConfig.from_yaml(args.config, args.overrides)
    except TrainConfigError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    problem = missing_model_folder(train_config, args.config)
    if problem:
        raise CommandError(problem, EXIT_USAGE)
    try:
        from kevin_backend.rl.trainer import Trainer

        trainer = Trainer(train_config)
        if args.resume == "never":
            resumed = False
        elif args.resume == "auto":
            resumed = trainer.resume()
        else:
            folder = Path(args.resume)
            if not folder.is_dir():
                raise CommandError(f"--resume: no checkpoint folder {folder}", EXIT_USAGE)
            resumed = trainer.resume(folder)
    except TrainConfigError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    except ImportError as exc:
        raise CommandError(f"{exc} (pip install 'kevin_backend[train]')", EXIT_USAGE) from exc
    main = trainer.accelerator.is_main_process
    if main:
        start = f"resumed after batch {trainer.state.batch}" if resumed else "from the start"
        print(f"kevin train: {len(trainer.tasks)} tasks, {train_config.grpo.tasks_per_batch} per batch, "
              f"{train_config.rollout.trajectories} trajectories x {train_config.rollout.turns} turns; "
              f"{start}; run folder {train_config.run_dir}", file=sys.stderr, flush=True)

    until = args.batches or train_config.batches

    def show(m: Any) -> None:
        if not main:
            return
        speed = "-" if m.mean_speedup is None else f"{m.mean_speedup:.2f}x"
        opener = "" if m.not_opener_rate is None else f", not-opener {m.not_opener_rate:.2f}"
        print(f"  batch {m.batch}/{until}: score {m.mean_score:.3f}, correct {m.correct_rate:.2f}, speedup {speed}, "
              f"reply {m.reply_tokens:.0f} tok{opener}, loops {m.repetition_rate:.2f}; loss {m.steps[0].loss:.4g}, "
              f"grad norm {_num(m.steps[0].grad_norm)}; {m.rollout_seconds:.1f} s rollouts, "
              f"{m.train_seconds:.1f} s training", file=sys.stderr, flush=True)

    sft = train_config.sft

    def show_sft(step: Any) -> None:  # the warm start: a line every tenth of its steps
        total = getattr(sft, "steps", None) or 0
        every = max(1, total // 10) if total else 10
        if main and (step.step == 1 or step.step % every == 0 or step.step == total):
            print(f"  warm start step {step.step}/{total or '?'}: loss {step.loss:.4g}, {step.tokens} reply tokens, "
                  f"grad norm {_num(step.grad_norm)}, lr {step.lr:.3g}", file=sys.stderr, flush=True)

    try:
        trainer.train(batches=until, on_batch=show, on_sft=show_sft)
    finally:
        trainer.close()
    if main:
        print(f"done: {trainer.state.batch} batches, {trainer.state.optimizer_step} optimizer steps; metrics in "
              f"{Path(train_config.run_dir) / 'metrics.jsonl'}", file=sys.stderr)
    return EXIT_OK


# The shipped configs that train a model built locally (nothing is downloaded), and the command
# that builds it at model.path ({path}), with the tasks it needs where it needs them ({tasks}: the
# config's first task folder).
MODEL_BUILDERS: dict[str, str] = {
    "tiny.yaml": "python tests/test_rl_train.py {path}",
    "h200-builtin.yaml": "python -m kevin_backend.rl.tiny write-tasks {tasks} && "
                         "python -m kevin_backend.rl.tiny make-model {path} --tasks {tasks}",
}
_BUILT_FOLDERS = ("runs/tiny-lm", "runs/h200-builtin-lm")  # their default model.path


def missing_model_folder(train_config: Any, config_path: Path) -> str | None:
    """What is wrong when `model.path` names a local folder that is not there, else None.

    A path is a local folder when it cannot be a model hub name ("org/name" or "name"): it is
    absolute, starts with "." or "~", has more than one "/", its parent folder exists here, or it is
    the folder a shipped config builds. A hub name is left to transformers to fetch."""
    text = train_config.model.path
    path = Path(text).expanduser()
    if path.is_dir():
        return None
    builder = MODEL_BUILDERS.get(Path(config_path).name)
    normal = text.replace("\\", "/").strip("/")
    local = (path.is_absolute() or text.startswith((".", "~")) or normal.count("/") > 1
             or (normal.count("/") == 1 and path.parent.is_dir()) or normal in _BUILT_FOLDERS or path.exists())
    if not local:
        return None
    if path.exists():
        return f"model.path {text}: not a folder (a model folder holds config.json and the weights)"
    tasks = (train_config.tasks.folders or ("TASKS",))[0]
    how = (f"build it with: {builder.format(path=text, tasks=tasks)}" if builder else
           "build or copy the model there, or set model.path to another folder or a hub name "
           "(--set model.path=...)")
    return f"model.path {text}: no such model folder (from {config_path}); {how}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _plot(args: argparse.Namespace, config: Config) -> int:
    from kevin_backend.rl.metrics import plot_metrics

    try:
        out = plot_metrics(args.run_dir, args.out)
    except FileNotFoundError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    except ImportError as exc:
        raise CommandError(f"plotting needs matplotlib: pip install matplotlib ({exc})", EXIT_USAGE) from exc
    print(out)
    return EXIT_OK
