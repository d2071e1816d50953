"""`kevin eval PROBLEM.py CANDIDATE.py`: judge a candidate kernel against a KernelBench problem.
`kevin eval PROBLEM.py FOLDER/`: judge every `*.py` in the folder, builds at once, runs through
the judge's pool of workers, a line per verdict as it arrives and a summary.

The problem's model and inputs are placed as KernelBench's harness places them: on the GPU under
test (`--device cuda:N`, default the current device), whatever device `get_inputs()` makes them on.

With --json, `correct` is null for a candidate that only passed the static rules: it was not run,
so there is no correctness verdict (exit 0 says it passes the rules).

Exit codes: 0 accepted (or, with --static-only, passes the rules), 1 rejected, 2 usage error
(a missing file, a problem without Model, or full judging asked for where it cannot run), 3 no
verdict: the judge itself failed (RESOURCE: it could not get GPU memory; INFRA: an error of its
own), which says nothing about the candidate. For a folder: 3 if any run got no verdict, else 1
if any candidate was rejected, else 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kevin_backend.cli.main import EXIT_FAILED, EXIT_NO_VERDICT, EXIT_OK, EXIT_USAGE, CommandError, require_cuda
from kevin_backend.config import Config, build_root

if TYPE_CHECKING:  # torch and the judge are imported when the command runs, not to parse its arguments
    from kevin_backend.judge.result import JudgeResult

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "eval", parents=parents, help="judge a candidate kernel against a KernelBench problem",
        description="Judge a candidate kernel program (or every *.py of a folder) against a KernelBench problem: "
                    "the static rules, the build, then correctness against a float64 run of the reference and timing "
                    "against eager and Inductor, in a sandbox on the GPU under test. --static-only stops after the "
                    "rules and needs no GPU. Exit 0 accepted, 1 rejected, 2 usage error, 3 no verdict (the judge "
                    "itself failed).")
    p.add_argument("problem", type=Path, help="KernelBench problem: Model, get_inputs, get_init_inputs")
    p.add_argument("candidate", type=Path, help="candidate program defining ModelNew, or a folder of them (*.py)")
    p.add_argument("--trials", type=int, default=100, help="timing trials (default 100)")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.add_argument("--static-only", action="store_true", help="stop after the static rules")
    p.add_argument("--device", default=None, help="the GPU under test, e.g. cuda:1 (default: the current device)")
    p.add_argument("--workers", type=int, default=4, help="sandboxed judge workers at once, for a folder (default 4)")
    p.add_argument("--salt", type=int, default=0,
                   help="the input sets' salt, to judge on the inputs of an earlier verdict (its JSON's \"salt\"); "
                        "default: fresh inputs every time")
    p.set_defaults(handler=_eval)


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise CommandError(f"cannot read {what} {path}: {exc.strerror or exc}", EXIT_USAGE) from exc


def _eval(args: argparse.Namespace, config: Config) -> int:
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.result import Reason
    from kevin_backend.judge.sandbox import RunConfig
    from kevin_backend.judge.static_judge import ProblemError, check_problem, judge_static

    problem = _read(args.problem, "problem")
    try:
        check_problem(problem)
    except ProblemError as exc:
        raise CommandError(f"{args.problem}: {exc}", EXIT_USAGE) from exc
    if args.trials < 1:
        raise CommandError("--trials must be at least 1", EXIT_USAGE)
    if args.workers < 1:
        raise CommandError("--workers must be at least 1", EXIT_USAGE)
    if not 0 <= args.salt < (1 << 31):
        raise CommandError("--salt must be between 0 and 2^31 - 1", EXIT_USAGE)
    if args.candidate.is_dir():
        return _eval_folder(args, config, problem)
    candidate = _read(args.candidate, "candidate")
    result = judge_static(candidate)
    if result.reason is Reason.STATIC_OK and not args.static_only:
        require_cuda("judging a kernel needs a CUDA GPU (use --static-only for the rules alone)")
        device = _device(args.device)
        run_config = RunConfig(trials=args.trials, device=device, salt=args.salt)
        with Judge(build_root(config.cache_dir), run_config, workers=0) as judge:
            result = judge.judge(problem, candidate)
    if args.json:
        print(json.dumps(_verdict(result), indent=2))
    else:
        print(_line(args.candidate, result))
        if result.feedback:
            print(result.feedback)
    return _exit_code([result])


def _verdict(result: JudgeResult) -> dict:
    """The verdict as JSON. `correct` is the judge's correctness verdict (outputs compared with the
    reference): true or false where the candidate ran or was rejected, null where it was not run
    (a static pass, `--static-only`: the rules say nothing about its outputs); `score` likewise."""
    from kevin_backend.judge.result import Reason

    data = result.as_dict()
    if result.reason is Reason.STATIC_OK:
        data["correct"] = None
        data["score"] = None
    return data


def _line(path: Path, result: JudgeResult) -> str:
    from kevin_backend.judge.result import Reason

    if result.reason is Reason.ACCEPTED:
        t = result.timings
        verdict = (f"accepted: {t.kernel_ms:.4f} ms, {t.speedup_vs_eager:.2f}x vs eager"
                   + (f", {t.speedup_vs_inductor:.2f}x vs Inductor" if t.speedup_vs_inductor else "")
                   + f", score {result.score:.2f}")
    elif result.reason is Reason.STATIC_OK:
        verdict = "passes the static rules"
    elif result.judge_side:
        verdict = f"no verdict: {result.reason.value}"
    else:
        verdict = f"rejected: {result.reason.value}"
        if result.violations:  # the rules broken, by id (the feedback has the details)
            verdict += f" [{', '.join(dict.fromkeys(v.rule for v in result.violations))}]"
    where = f", {result.device}" if result.device else ""
    return f"{path}: {verdict} (stage {result.stage.value}{where})"


def _exit_code(results: list[JudgeResult]) -> int:
    from kevin_backend.judge.result import Reason

    if any(r.judge_side for r in results):
        return EXIT_NO_VERDICT
    return EXIT_OK if all(r.reason in (Reason.ACCEPTED, Reason.STATIC_OK) for r in results) else EXIT_FAILED


def _eval_folder(args: argparse.Namespace, config: Config, problem: str) -> int:
    from kevin_backend.bench.progress import Progress
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.result import Reason
    from kevin_backend.judge.sandbox import RunConfig
    from kevin_backend.judge.static_judge import judge_static

    paths = sorted(p for p in args.candidate.glob("*.py") if p.is_file())
    if not paths:
        raise CommandError(f"{args.candidate}: no candidate programs (*.py) in this folder", EXIT_USAGE)
    sources = [_read(p, "candidate") for p in paths]
    if args.static_only:
        results = [judge_static(s) for s in sources]
    else:
        require_cuda("judging kernels needs a CUDA GPU (use --static-only for the rules alone)")
        device = _device(args.device)
        progress = Progress(len(paths), enabled=not args.json)
        lock = threading.Lock()

        def done(index: int, result: JudgeResult) -> None:
            with lock:
                progress.finish(paths[index].name, result.reason.name)

        print(f"judging {len(paths)} candidates from {args.candidate} on {device} with {args.workers} workers",
              file=sys.stderr, flush=True)
        began = time.perf_counter()
        run_config = RunConfig(trials=args.trials, device=device, salt=args.salt)
        with Judge(build_root(config.cache_dir), run_config, workers=args.workers) as judge:
            results = judge.evaluate_many(problem, sources, at_once=args.workers, done=done)
        seconds = time.perf_counter() - began
        print(f"{len(paths)} candidates in {seconds:.1f} s ({len(paths) / seconds * 60:.1f} per minute)",
              file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps([{"candidate": str(p), **_verdict(r)} for p, r in zip(paths, results)], indent=2))
    else:
        for path, result in zip(paths, results):
            print(_line(path, result))
        # with --static-only nothing ran: a pass is a pass of the rules, not an acceptance
        passed = "passed the static rules" if args.static_only else "accepted"
        counts = {passed: sum(r.reason in (Reason.ACCEPTED, Reason.STATIC_OK) for r in results),
                  "no verdict": sum(r.judge_side for r in results)}
        counts["rejected"] = len(results) - counts[passed] - counts["no verdict"]
        print(", ".join(f"{v} {k}" for k, v in counts.items()))
    return _exit_code(results)


def _device(name: str | None) -> str:
    """`cuda:N` checked against the GPUs there are (a usage error names the problem)."""
    import torch

    if name is None:
        return f"cuda:{torch.cuda.current_device()}"
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise CommandError(f"--device {name!r}: {exc}", EXIT_USAGE) from exc
    if device.type != "cuda":
        raise CommandError(f"--device {name!r}: kernels are judged on a CUDA GPU (cuda or cuda:N)", EXIT_USAGE)
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise CommandError(f"--device {name!r}: there are {torch.cuda.device_count()} CUDA devices", EXIT_USAGE)
    return f"cuda:{index}"
