"""Every honest kernel program the project holds, through the static rules: none may break one.

    python tools/static_honest.py                 # every corpus, every built-in program
    python tools/static_honest.py --sample 1      # the built-in writer's first variant per task

The corpora: the judge's honest cases and the hacks only running can catch (tests/judge_cases.py),
the KernelBench corpus's honest candidates and run-time failures (tests/kb_corpus), the build
styles (tests/build_styles), the seed cache's kernels and task programs (kernels_cache/), and
every program the built-in writer writes for tools/builtin_tasks.json, every variant. Prints a
count per corpus and each program that breaks a rule; exits 1 when one does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent


def judge_cases() -> Iterator[tuple[str, str]]:
    sys.path.insert(0, str(ROOT / "tests"))
    from judge_cases import HONEST, RUNTIME_HACKS

    for case in HONEST + RUNTIME_HACKS:
        yield case.name, case.source


def kb_corpus() -> Iterator[tuple[str, str]]:
    sys.path.insert(0, str(ROOT / "tests"))
    from kb_corpus.corpus import is_rule_id, load_corpus

    for case in load_corpus():
        if not any(is_rule_id(v) for v in case.expect):  # honest, or wrong only at run time
            yield case.name, case.candidate_source


# Build styles written to exercise the build, whose forward hands work to PyTorch: the rules
# rejected them before the C++ rules were read on the preprocessor's output, and still do.
NOT_HONEST = frozenset({"bias_relu_if_else_template"})  # torch.matmul in forward


def build_styles() -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / "tests" / "build_styles").glob("*.py")):
        if path.stem not in NOT_HONEST:
            yield path.stem, path.read_text()


def seed_kernels() -> Iterator[tuple[str, str]]:
    for meta in sorted((ROOT / "kernels_cache").glob("*/meta.json")):
        kernel = meta.parent / "kernel.py"
        if kernel.exists():
            yield meta.parent.name, kernel.read_text()


def seed_tasks() -> Iterator[tuple[str, str]]:
    for task in sorted((ROOT / "kernels_cache").glob("*/task.py")):
        yield task.parent.name, task.read_text()


def builtin_programs(sample: int | None) -> Iterator[tuple[str, str]]:
    from kevin_backend.generate.builtin.plan import Declined
    from kevin_backend.generate.builtin.planner import plan_task
    from kevin_backend.generate.builtin.program import write_program
    from kevin_backend.generate.builtin.variants import variants_for

    for name, source in json.loads((ROOT / "tools" / "builtin_tasks.json").read_text()):
        if source is None:
            continue
        plan = plan_task(source)
        if isinstance(plan, Declined):
            continue
        for i, variant in enumerate(variants_for(plan)[:sample]):
            try:
                text = write_program(plan, variant, name=f"kevin_builtin_{i}", doc="Written by kevin's built-in writer.")
            except Exception:  # noqa: BLE001 - a variant the plan cannot take (tools/builtin_programs.py)
                continue
            yield f"{name}[{i}]", text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=None, help="built-in variants per task (default: all)")
    args = parser.parse_args(argv)
    from kevin_backend.toolchain.static_rules import check_program, check_task_program

    corpora = [("judge cases", judge_cases(), check_program), ("kb corpus", kb_corpus(), check_program),
               ("build styles", build_styles(), check_program), ("seed kernels", seed_kernels(), check_program),
               ("seed tasks", seed_tasks(), check_task_program),
               ("built-in programs", builtin_programs(args.sample), check_program)]
    failed = total = 0
    for label, programs, rules in corpora:
        count = bad = 0
        for name, source in programs:
            count += 1
            violations = rules(source)
            if violations:
                bad += 1
                print(f"  {label}: {name}: " + "; ".join(str(v) for v in violations[:3]))
        print(f"{label}: {count} programs, {count - bad} pass the static rules")
        failed += bad
        total += count
    print(f"{total} honest programs, {failed} break a rule")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
