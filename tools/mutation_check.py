"""The mutation check: each defect the judge guards against, put back into a copy of the project,
must turn at least one of the tests that name it red. A mutation whose tests stay green shows tests
that cannot fail for what they claim.

    python tools/mutation_check.py             every mutation; exit 1 when one survives or no longer applies,
                                               2 when the unchanged copy fails its tests
    python tools/mutation_check.py --list      the mutations and their tests
    python tools/mutation_check.py NAME ...    some of them
    python tools/mutation_check.py --part 1/2  every second mutation from the first (the parts of CI's
                                               two test files, which pytest-xdist runs side by side)

Each mutation replaces one exact piece of a module's text (it must occur exactly once: a mutation
that no longer applies is an error, so the list keeps up with the code) and runs its tests on the
copy with pytest; "killed" means pytest reported failed tests (exit status 1), not that the copy
failed to import. A mutation names only tests it turns red (a test that stays green under it
cannot kill it, and the control, which runs every named test on the unchanged copy first, would
only take longer); run its tests without `-x` on the mutated copy to see which those are.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the project's root
    find: str
    replace: str
    tests: tuple[str, ...]  # pytest node ids: only tests this mutation turns red (the control runs them all)
    why: str


MUTATIONS = (
    Mutation("float64-comparison-removed", "kevin_backend/judge/reference_sets.py",
             "    if run.exact_dtype is None or not exact_model:\n        return None\n", "    return None\n",
             ("tests/test_judge_runner.py::test_an_error_only_the_float64_reference_sees_is_a_mismatch",),
             "outputs compared with eager at KernelBench's tolerances only"),
    Mutation("row-wise-bound-dropped", "kevin_backend/measure/compare.py",
             "    if bound.floor is None:\n        return Rule(bound.rho, bound.rho,",
             "    if True:\n        return Rule(bound.rho, bound.rho,",
             ("tests/test_compare_16bit.py::test_a_group_is_held_to_its_own_scale",
              "tests/test_compare_16bit.py::test_zeroing_the_small_elements_of_a_mixed_scale_product_is_caught",
              "tests/test_compare_16bit.py::test_gelu_with_its_smallest_outputs_zeroed_is_caught",
              "tests/test_compare_16bit.py::test_float16_subnormal_outputs_rounded_honestly_pass"),
             "16-bit outputs held to the whole output's mean as an absolute floor, not each group's own scale"),
    Mutation("graph-threshold-moved", "kevin_backend/backend/graph_check.py",
             "    return _Pairs(variant, measure, min(margin, 0.0))\n",
             "    return _Pairs(variant, measure, min(margin, 0.03))\n",
             ("tests/test_graph_check.py::test_the_graph_must_be_faster_than_inductors_no_more_no_less",),
             "the graph check asks 3% more of the kernels than being faster"),
    Mutation("between-run-spread-ignored", "kevin_backend/judge/decide.py",
             "    between = between_sd ** 2\n", "    between = 0.0\n",
             ("tests/test_decide_runs.py::test_a_kernel_tied_at_the_margin_is_kept_in_at_most_5_percent_of_1000_decisions",
              "tests/test_decide_runs.py::test_a_cache_decision_counts_the_spread_between_runs"),
             "a re-timing's bound counts its rounds' noise only, not the runs' spread"),
    Mutation("timed-outputs-unchecked", "kevin_backend/judge/timing_phase.py",
             "        wrong = timed_output_wrong(run.model, outputs[j], got.pop(j), want, exact, j, run.precision)\n",
             "        wrong = ''\n",
             ("tests/test_judge_isolation.py::test_a_kernel_that_computes_only_when_audited_is_caught_in_the_timed_calls",
              "tests/test_judge_runner.py::test_output_cached_by_input_pointer_is_caught"),
             "the timed calls' outputs never compared"),
    Mutation("checks-on-shared-slots", "kevin_backend/judge/timing_phase.py",
             "    memory = slots.private[k]\n",
             "    memory = slots.arena.tensor[j * slots.stride:(j + 1) * slots.stride]\n",
             ("tests/test_judge_isolation.py::test_the_references_of_a_timed_check_run_on_the_judges_own_copy_of_the_inputs",),
             "the references of a timed check read the slots the candidate can write"),
    Mutation("syscall-filter-off", "kevin_backend/judge/candidate_worker.py",
             "            self.filtered = forbid_escapes()\n", "            self.filtered = False\n",
             ("tests/test_judge_isolation.py::test_the_kernel_refuses_a_candidates_escapes[fork]",
              "tests/test_judge_isolation.py::test_the_kernel_refuses_a_candidates_escapes[start-a-program]"),
             "the candidate's process may fork, run programs and signal others"),
    Mutation("not-confined", "kevin_backend/judge/candidate_worker.py",
             "            confinement = confine(writable=self.folder).describe()\n", "            confinement = ''\n",
             ("tests/test_judge_isolation.py::test_the_candidates_process_cannot_write_files_read_memory_or_connect"
              "[write-a-file-of-the-judges]",
              "tests/test_judge_isolation.py::test_the_candidates_process_is_the_first_the_out_of_memory_killer_picks"),
             "the candidate's process keeps root's capabilities, writes anywhere, connects over TCP"),
    Mutation("judge-steps-charged-to-the-candidate", "kevin_backend/judge/phases.py",
             "        if self.phase in self.candidate_phases:\n            self.spent += at - self.since\n",
             "        if True:\n            self.spent += at - self.since\n",
             ("tests/test_phase_clock.py::test_the_candidates_phases_share_the_limit_and_each_judge_step_has_its_own",
              "tests/test_phase_clock.py::test_a_silent_worker_is_stopped_and_the_phase_it_fell_silent_in_says_whose[candidate-True]"),
             "the judge's own slow steps eat the candidate's time limit: an honest slow candidate stopped as a hang"),
    Mutation("small-gains-never-tried-together", "kevin_backend/backend/graph_check.py",
             "    hopeful = frozenset(d for d in dropped if not pairs.slower.get(d, False))\n",
             "    hopeful = frozenset()\n",
             ("tests/test_graph_check.py::test_gains_too_small_to_show_alone_are_kept_together",),
             "kernels whose gains show only summed are all dropped by the graph check"),
    Mutation("header-before-the-device-part", "kevin_backend/toolchain/build.py",
             "        header = None if pch_built(self.pch_root, toolchain) else _in_background(ensure_pch, self.pch_root, toolchain)\n",
             "        header = None\n",
             ("tests/test_nvcc_chains.py::test_a_first_build_makes_the_header_beside_its_device_part",),
             "a fresh cache's first build waits for the precompiled header before its device part compiles"),
    Mutation("inputs-carry-their-rounding", "kevin_backend/measure/precision.py",
             "            came = _narrower(came, self.carried.get(t))\n",
             "            came = _narrower(came, self.carried.get(t, t.dtype if t.dtype in SIXTEEN_BIT else None))\n",
             ("tests/test_carried_precision.py::test_the_tracker_marks_what_a_16_bit_rounding_went_into",),
             "a float32 output computed from 16-bit inputs held only to the 16-bit bound (their float64 copies are exact)"),
)


def _copy(into: Path) -> Path:
    """The project's code and tests in `into` (no git data, builds or caches), with the stored
    measurements tests read (the re-timing's noise model)."""
    ignore = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", ".whl", ".dev", ".out")
    for name in ("kevin_backend", "tests", "pyproject.toml", "benchmarks/results/gpu_tests/retime_gpu_h200_run9_third.log"):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=ignore)
        elif source.exists():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def apply(mutation: Mutation, copy: Path) -> None:
    target = copy / mutation.path
    text = target.read_text()
    count = text.count(mutation.find)
    if count != 1:
        raise ValueError(f"{mutation.name}: the text to replace occurs {count} times in {mutation.path} (it must occur once)")
    target.write_text(text.replace(mutation.find, mutation.replace))


def run_one(mutation: Mutation | None, tests: tuple[str, ...] = ()) -> tuple[str, float, str]:
    """('killed' | 'survived' | 'error', seconds, pytest's last lines); None: the copy unchanged
    (the control: its tests must pass, or a kill would mean nothing)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kevin-mutation-") as tmp:
        copy = _copy(Path(tmp))
        try:
            if mutation is not None:
                apply(mutation, copy)
        except ValueError as exc:
            return "error", time.perf_counter() - start, str(exc)
        tests = mutation.tests if mutation is not None else tests
        code, output = _pytest_forked(copy, ["-q", "-x", "-p", "no:cacheprovider", *tests], timeout=900.0)
    tail = "\n".join(output.strip().splitlines()[-3:])
    state = {0: "survived", 1: "killed"}.get(code, "error") if code is not None else "error"
    return state, time.perf_counter() - start, tail


def _pytest_forked(copy: Path, args: list[str], timeout: float) -> tuple[int | None, str]:
    """pytest on `args` in `copy`, in a child forked from this process once torch and pytest are
    imported here (a fresh interpreter per run spent most of a mutation's seconds importing them);
    no module of the project is imported here, so the child imports the copy's, mutated or not,
    and the processes its tests start find the copy first on PYTHONPATH. (exit status, or None
    when the run outlived `timeout` and was killed; what it printed)."""
    import pytest
    import torch  # noqa: F401 - imported once, for every child

    with tempfile.TemporaryFile(mode="w+") as out:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 3
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
                os.chdir(copy)
                sys.path.insert(0, str(copy))
                os.environ["PYTHONPATH"] = str(copy) + os.pathsep + os.environ.get("PYTHONPATH", "")
                code = int(pytest.main(args))
            except BaseException:  # noqa: BLE001 - reported as the run's output
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        deadline = time.monotonic() + timeout
        while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                out.seek(0)
                return None, out.read() + f"\n(killed after {timeout:.0f} s)"
            time.sleep(0.05)
        out.seek(0)
        return os.waitstatus_to_exitcode(ended[1]), out.read()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--part", metavar="K/N", help="of the mutations chosen, every N-th from the K-th (1 <= K <= N)")
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name}: {m.why}\n    {m.path}; tests: {', '.join(m.tests)}")
        return 0
    known = {m.name: m for m in MUTATIONS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"no mutation named {', '.join(unknown)} (see --list)")
    chosen = [known[n] for n in args.names] if args.names else list(MUTATIONS)
    if args.part:
        k, _, n = args.part.partition("/")
        if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
            parser.error(f"--part {args.part}: expected K/N with 1 <= K <= N")
        chosen = chosen[int(k) - 1::int(n)]
    every_test = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
    state, seconds, tail = run_one(None, every_test)
    print(f"[control] no mutation: {'passed' if state == 'survived' else 'FAILED'} ({seconds:.0f} s)", flush=True)
    if state != "survived":
        print("    " + tail.replace("\n", "\n    "), flush=True)
        return 2
    failures = 0
    for k, mutation in enumerate(chosen, 1):
        state, seconds, tail = run_one(mutation)
        print(f"[{k}/{len(chosen)}] {mutation.name}: {state} ({seconds:.0f} s)", flush=True)
        if state != "killed":
            failures += 1
            print("    " + tail.replace("\n", "\n    "), flush=True)
    print(f"{len(chosen) - failures} of {len(chosen)} mutations killed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
