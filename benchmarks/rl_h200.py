"""A short training run with the real judge on tasks of the built-in suite, metrics shown.

On a CUDA machine: writes the tasks (`--tasks`, default six small fp32 tasks: five pointwise
chains and a row sum), builds a small Qwen3 model and its tokenizer (nothing is downloaded),
trains with configs/train/h200-builtin.yaml (the `sft` warm start on the built-in writer's
replies, then GRPO batches whose rewards are the judge's scores), prints the warm start's losses
and one line per batch, and writes into `--out`:

    rl_h200.json     config, warm-start summary and steps, per-batch metrics, timings
    metrics.png      the run's curves (`kevin train plot`)
    run/             the run folder (metrics.jsonl, trajectories, checkpoints, final model)

    python benchmarks/rl_h200.py --out results/rl_h200
    python benchmarks/rl_h200.py --out /tmp/smoke --smoke     # CPU, tiny sizes, synthetic judge

`--smoke` runs the same code on a CPU in well under a minute: a one-layer model, two tasks, a
few warm-start steps and one batch judged by the synthetic judge (which pays for "__global__"
in the extracted program).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "train" / "h200-builtin.yaml"
SMOKE_TASKS = ("gated-f32", "sum-f32")

# the smoke run: everything small, the synthetic judge, one batch
SMOKE_OVERRIDES = [
    "batches=1", "sft.steps=4", "sft.batch_size=4", "sft.micro_batch_size=4", "sft.trajectories=2", "sft.turns=1",
    "sft.warmup_steps=0", "sft.lr=3e-3", "rollout.trajectories=2", "rollout.turns=1", "rollout.max_tokens=24",
    "grpo.tasks_per_batch=1", "grpo.micro_batch_size=2", "judge={kind: synthetic, target: __global__}",
    "monitor.tensorboard=false",
]


def _stamp(began: float) -> str:
    return f"[{time.perf_counter() - began:6.1f} s]"


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON, the PNG and the run")
    parser.add_argument("--smoke", action="store_true", help="CPU smoke run: tiny sizes, synthetic judge, 1 batch")
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--tasks", help="comma-separated built-in suite task names (default: the config's six; "
                                        f"smoke: {','.join(SMOKE_TASKS)})")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value (after the script's own), e.g. --set batches=3")
    parser.add_argument("--hidden", type=int, help="model width (default 384; smoke 32)")
    parser.add_argument("--layers", type=int, help="decoder layers (default 4; smoke 1)")
    parser.add_argument("--keep", action="store_true", help="keep an existing run folder in --out (resume it)")
    args = parser.parse_args(argv)
    began = time.perf_counter()

    import torch

    from kevin_backend.rl.train_config import TrainConfig, TrainConfigError
    from kevin_backend.rl.metrics import plot_metrics, read_metrics, read_sft_metrics
    from kevin_backend.rl.tiny import DEFAULT_SUITE_TASKS, build_model, write_suite_tasks

    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("rl_h200 needs a CUDA GPU for the real judge (use --smoke for a CPU run)", file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    run_dir, model_dir, task_dir = out / "run", out / "model", out / "tasks"
    if not args.keep:
        for folder in (run_dir, model_dir, task_dir):
            shutil.rmtree(folder, ignore_errors=True)
    gpu = torch.cuda.get_device_name() if cuda else ""
    capability = "%d.%d" % torch.cuda.get_device_capability() if cuda else ""
    device = f"{gpu} (capability {capability}), torch {torch.__version__}" if cuda else f"CPU, torch {torch.__version__}"
    print(f"{_stamp(began)} {device}", flush=True)

    # 1. tasks
    names = args.tasks.split(",") if args.tasks else list(SMOKE_TASKS if args.smoke else DEFAULT_SUITE_TASKS)
    try:
        written = write_suite_tasks(task_dir, names)
    except ValueError as exc:
        print(f"--tasks: {exc}", file=sys.stderr)
        return 2
    print(f"{_stamp(began)} {len(written)} tasks in {task_dir}: {', '.join(names)}", flush=True)

    # 2. model and tokenizer
    hidden = args.hidden or (32 if args.smoke else 384)
    layers = args.layers or (1 if args.smoke else 4)
    heads = 2 if args.smoke else 6
    if not (model_dir / "config.json").is_file():
        build_model(model_dir, tasks=task_dir, hidden=hidden, layers=layers, heads=heads,
                    max_positions=1024 if args.smoke else 4096, gpu=gpu, capability=capability)
    params = _parameters(model_dir)
    print(f"{_stamp(began)} model in {model_dir}: hidden {hidden}, {layers} layers, {params / 1e6:.2f}M parameters",
          flush=True)

    # 3. the config
    overrides = [f"run_dir={run_dir}", f"model.path={model_dir}", f"tasks.folders=[{task_dir}]"]
    if args.smoke:
        overrides += SMOKE_OVERRIDES
    if importlib.util.find_spec("tensorboard") is None:
        print(f"{_stamp(began)} tensorboard is not installed: metrics go to metrics.jsonl only", flush=True)
        overrides.append("monitor.tensorboard=false")
    overrides += args.overrides
    try:
        config = TrainConfig.from_yaml(args.config, overrides)
    except TrainConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{_stamp(began)} config {args.config.name}: {config.batches} batches of {config.grpo.tasks_per_batch} "
          f"tasks x {config.rollout.trajectories} trajectories x {config.rollout.turns} turns, judge "
          f"{config.judge.kind}; warm start {_sft_line(config)}", flush=True)

    # 4. train
    from kevin_backend.rl.rollout import make_judge
    from kevin_backend.rl.trainer import Trainer

    judge = None
    if config.judge.kind == "kernelbench":
        judge = _Talking(make_judge(config.judge, run_dir), began)
    trainer = Trainer(config, judge=judge)
    resumed = trainer.resume() if args.keep else False
    if resumed:
        print(f"{_stamp(began)} resumed after batch {trainer.state.batch}", flush=True)
    sft = config.sft
    every = max(1, (sft.steps or 100) // 20) if sft is not None and sft.epochs is None else 10  # ~20 lines

    def on_sft(step: Any) -> None:
        if step.step == 1 or step.step % every == 0:
            print(f"{_stamp(began)}   sft step {step.step}: loss {step.loss:.4g}, grad norm {step.grad_norm:.3g}, "
                  f"lr {step.lr:.3g}, {step.tokens} reply tokens", flush=True)

    def on_batch(m: Any) -> None:
        print(f"{_stamp(began)}   batch {m.batch}/{config.batches}: score {m.mean_score:.3f}, correct "
              f"{m.correct_rate:.2f}, speedup {_fmt(m.mean_speedup, '.2f')}, reply {m.reply_tokens:.0f} tok, loss "
              f"{m.steps[0].loss:.4g}; {m.rollout_seconds:.1f} s rollouts, {m.train_seconds:.1f} s training", flush=True)

    timings: dict[str, float] = {"setup": time.perf_counter() - began}
    try:
        t0 = time.perf_counter()
        if config.sft is not None and not trainer.state.sft_done:
            print(f"{_stamp(began)} warm start ...", flush=True)
        trainer.warm_start(on_sft)
        timings["sft"] = time.perf_counter() - t0
        if trainer.sft_report is not None:
            r = trainer.sft_report
            print(f"{_stamp(began)} warm start: {r.demonstrations} demonstrations of {r.tasks} tasks, {r.steps} steps "
                  f"({r.epochs:.1f} epochs): loss {r.loss_before:.4g} -> {r.loss_after:.4g}, token accuracy "
                  f"{r.token_accuracy_before:.3f} -> {r.token_accuracy_after:.3f}, exact replies "
                  f"{r.exact_before:.2f} -> {r.exact_after:.2f}, longest reply {r.longest_reply} tokens", flush=True)
        t0 = time.perf_counter()
        print(f"{_stamp(began)} GRPO ...", flush=True)
        trainer.train(on_batch=on_batch)
        timings["grpo"] = time.perf_counter() - t0
    finally:
        trainer.close()
    timings["total"] = time.perf_counter() - began

    # 5. the report
    sft_steps, sft_summary = read_sft_metrics(run_dir)
    rows = read_metrics(run_dir)  # every batch of the run (a resumed run's earlier ones too)
    _table(rows, sft_summary)
    png = plot_metrics(run_dir, out / "metrics.png")
    report = {
        "device": device,
        "smoke": args.smoke,
        "tasks": names,
        "model": {"folder": str(model_dir), "hidden": hidden, "layers": layers, "parameters": params},
        "config": config.as_dict(),
        "sft": sft_summary,
        "sft_steps": sft_steps,
        "batches": rows,
        "seconds": timings,
    }
    path = out / "rl_h200.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"{_stamp(began)} wrote {path} and {png}", flush=True)
    return 0


class _Talking:
    """The run's judge, printing a line per verdict (a batch's judging takes a while)."""

    def __init__(self, judge: Any, began: float) -> None:
        self._judge = judge
        self._began = began
        self._count = 0
        self._lock = threading.Lock()  # the engine judges a turn's replies from several threads

    def judge(self, task_source: str, candidate_source: str) -> Any:
        t0 = time.perf_counter()
        result = self._judge.judge(task_source, candidate_source)
        with self._lock:
            self._count += 1
            count = self._count
        t = result.timings
        shown = ""
        if result.correct and t.kernel_ms is not None and t.speedup_vs_eager is not None:
            shown = f", {t.kernel_ms:.4g} ms ({t.speedup_vs_eager:.2f}x eager)"
        print(f"{_stamp(self._began)}     verdict {count}: {result.reason.name}{shown} "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
        return result


def _sft_line(config: Any) -> str:
    s = config.sft
    if s is None:
        return "none"
    amount = f"{s.epochs} epochs" if s.epochs is not None else f"{s.total_steps(1)} steps"
    return f"{amount} of {s.batch_size} demonstrations at lr {s.lr:g} ({s.trajectories} variants x {s.turns} turns)"


def _parameters(folder: Path) -> int:
    from safetensors import safe_open

    count = 0
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                count += math.prod(f.get_slice(name).get_shape())
    return count


def _table(rows: list[dict[str, Any]], sft: dict[str, Any] | None) -> None:
    if sft is not None:
        print("\nwarm start (all demonstrations, teacher forcing)")
        print("| | loss per reply token | token accuracy | exact replies |")
        print("|---|---|---|---|")
        print(f"| before | {sft['loss_before']:.4g} | {sft['token_accuracy_before']:.3f} | {sft['exact_before']:.2f} |")
        print(f"| after {sft['steps']} steps | {sft['loss_after']:.4g} | {sft['token_accuracy_after']:.3f} | "
              f"{sft['exact_after']:.2f} |")
    print("\nGRPO batches")
    print("| batch | mean score | correct rate | mean speedup | best score | reply tokens | truncated | loss | "
          "grad norm | rollout s | train s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        step = r["steps"][0] if r["steps"] else {}
        print(f"| {r['batch']} | {r['mean_score']:.3f} | {r['correct_rate']:.2f} | {_fmt(r['mean_speedup'], '.2f')} | "
              f"{r['best_score']:.3f} | {r['reply_tokens']:.0f} | {r['truncated_rate']:.2f} | "
              f"{_fmt(step.get('loss'), '.4g')} | {_fmt(step.get('grad_norm'), '.3g')} | {r['rollout_seconds']:.1f} | "
              f"{r['train_seconds']:.1f} |")
    print()


if __name__ == "__main__":
    sys.exit(main())
