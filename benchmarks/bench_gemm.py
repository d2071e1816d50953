"""The built-in writer's CUTLASS GEMMs on the GEMM-epilogue suite, through the real judge.

Each suite task (`generate/builtin/gemm_suite.py`) the GEMM writer plans (`gemm_plan.plan_gemm`;
the others are listed with the reason they are declined) is written once per tiling of its kind, the
programs built side by side (the build times kept: cold, and a tiling change of a built task),
then judged one at a time on the GPU (Hopper's kernels; `--arch sm80`: CUTLASS 2.x's, Ampere's, on
any GPU from compute capability 8.0): correctness on fresh inputs, the kernel timed beside
Inductor's default compile of the same task. The table has each task's best tiling.

Usage: python benchmarks/bench_gemm.py [--tasks NAME,...] [--trials 20] [--first N] [--extra-tilings] [--tail-tilings] [--orders] [--precise]
       [--arch sm80] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from kevin_backend.generate.builtin.gemm_kernel import FAST_MATH, GemmTiling
from kevin_backend.generate.builtin.gemm_plan import GEMM_PLANS, AnyGemm, GemmPlan, plan_gemm, plan_tilings, write_gemm_program
from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE, epilogue_share
from kevin_backend.generate.builtin.gemm_tail import KeptEnd, WideEnd



# Tilings the search does not try, measured with --extra-tilings: the two fastest with their
# cluster turned, the 128x256 tile without a cluster, and ping-pong with a 128x128 tile per warp group
EXTRA_TILINGS = (
    GemmTiling((128, 256, 64), (2, 1, 1), "cooperative"),
    GemmTiling((256, 128, 64), (1, 2, 1), "cooperative"),
    GemmTiling((128, 256, 64), (1, 1, 1), "cooperative"),
    GemmTiling((128, 128, 64), (1, 2, 1), "pingpong"),
    GemmTiling((128, 128, 64), (2, 1, 1), "pingpong"),
)
# ... and with --tail-tilings, the two fastest with the last waves of tiles shared by stream-K
# (CUTLASS's hybrid: whole waves one tile a CTA, the K iterations of the last one or two shared
# evenly among the SMs), and with an epilogue of 64 columns a subtile (CUTLASS's: 32)
TAIL_TILINGS = (
    GemmTiling((256, 128, 64), (2, 1, 1), "cooperative", "streamk"),
    GemmTiling((128, 256, 64), (1, 2, 1), "cooperative", "streamk"),
    GemmTiling((256, 128, 64), (1, 1, 1), "cooperative", "streamk"),
    GemmTiling((256, 128, 64), (2, 1, 1), "cooperative", epilogue_n=64),
    GemmTiling((128, 256, 64), (1, 2, 1), "cooperative", epilogue_n=64),
    GemmTiling((256, 128, 64), (2, 1, 1), "cooperative", "streamk", epilogue_n=64),
)

# The order of the tiles' work tried with --orders, on a task's first tiling: CTAs four and eight
# tiles side by side (their operands' rows shared in L2), and the raster along M, then along N
# (CUTLASS's heuristic picks one of the two: that variant is the first tiling again, a control)
ORDERS = ((4, ""), (8, ""), (1, "m"), (1, "n"))
# the name of a tiling's variant with the precise math (--precise: not the table's best, a comparison)
PRECISE = " (precise math)"


def order_variants(tiling: object) -> tuple:
    """`tiling` with each of `ORDERS` (a Hopper GEMM's tiling; none for any other kind)."""
    if not isinstance(tiling, GemmTiling):
        return ()
    return tuple(dataclasses.replace(tiling, swizzle=swizzle, raster=raster) for swizzle, raster in ORDERS)


def hopper_takes(plan: AnyGemm, tiling: GemmTiling) -> bool:
    """Whether `tiling`, one of the tilings the search does not try, applies to `plan`: a Hopper
    16-bit GEMM's (not a float32 or sm80 kernel's, nor a convolution's), with an epilogue subtile
    only where the output goes through shared memory."""
    if not isinstance(plan, GemmPlan) or plan.spec.sm80 or plan.spec.convolution is not None:
        return False
    return not (tiling.epilogue_n and plan.spec.direct_store)


def first_tilings(plan: AnyGemm, n: int) -> tuple:
    """The variants a search of `n` turns tries first (`plan_tilings`; all of them where `n` is 0),
    and the wide ends among the first `n` of their kind (`WideEnd`, `KeptEnd`), which a search turns
    to once a turn is refused: a softmax after a 16-bit GEMM is refused on its rounded end."""
    own = plan_tilings(plan)
    if not n:
        return own
    wide = [t for t in own if isinstance(t, (WideEnd, KeptEnd))]
    return own[:n] + tuple(t for t in wide[:n] if t not in own[:n])


def candidate_programs(plans: dict[str, AnyGemm], sources: dict[str, str], tilings: Callable[[AnyGemm], tuple],
                       precise: bool = False) -> dict[tuple[str, str], str]:
    """Each task's program in each of its tilings (`tilings(plan)`), by (task, tiling's name); with
    `precise`, also its first tiling's with the precise math where its program takes the device's
    (named with `PRECISE`: the program without `FAST_MATH`, its extension renamed)."""
    programs = {(name, tiling.name): write_gemm_program(plan, tiling, task_source=sources[name])
                for name, plan in plans.items() for tiling in tilings(plan)}
    for name, plan in plans.items() if precise else ():
        first = tilings(plan)[0].name
        fast = programs[(name, first)]
        if FAST_MATH in fast:
            programs[(name, first + PRECISE)] = fast.replace(FAST_MATH, "", 1).replace("load_inline(name='", "load_inline(name='precise_", 1)
    return programs


def max_autotune_numerics() -> dict[str, str]:
    """The judge's numerics for Inductor's max-autotune (without CUDA graphs, which the judge's own
    batches do not use) as the baseline: its config entries, as the cache key names them."""
    from torch._inductor import list_mode_options

    from kevin_backend.cache.key import inductor_config

    return {"inductor_config": inductor_config(list_mode_options("max-autotune-no-cudagraphs"))}


def cublaslt_task(source: str, plan: AnyGemm) -> str | None:
    """The task as cuBLASLt's fused epilogue computes it (`torch._addmm_activation`: bias, then
    ReLU or tanh-GELU), as a task of its own whose eager time is cuBLASLt's; None where the plan's
    epilogue is not one cuBLASLt fuses (or the task is more than one GEMM with its epilogue, or a
    convolution other than a 1x1 one, whose product is a GEMM of its channels-last rows)."""
    if not isinstance(plan, GemmPlan) or (plan.spec.convolution is not None and not plan.conv):
        return None
    e = plan.spec.epilogue
    if not e.bias or e.residual or e.alpha != 1 or e.activation not in ("relu", "gelu_tanh"):
        return None
    if plan.conv:  # N x C x H x W (channels-last) times C_out x C x 1 x 1: rows of C channels, out N x C_out x H x W
        return source + _CUBLASLT_MODEL.format(
            rows="x.permute(0, 2, 3, 1).reshape(-1, x.shape[1])", w=f"v[{plan.w}].reshape(v[{plan.w}].shape[0], -1).t()",
            bias=plan.bias, x=plan.x, gelu=e.activation == "gelu_tanh",
            out="out.reshape(x.shape[0], x.shape[2], x.shape[3], out.shape[-1]).permute(0, 3, 1, 2)")
    w = f"v[{plan.w}].t()" if plan.spec.weight == "nk" else f"v[{plan.w}]"
    return source + _CUBLASLT_MODEL.format(rows="x.reshape(-1, x.shape[-1])", w=w, bias=plan.bias, x=plan.x,
                                           gelu=e.activation == "gelu_tanh", out="out.reshape(*x.shape[:-1], out.shape[-1])")


_CUBLASLT_MODEL = """

import torch.nn as nn


class Model(nn.Module):  # the same inputs, through cuBLASLt's fused epilogue: a peer's time
    def __init__(self, *init_inputs):
        super().__init__()

    def forward(self, *v):
        x = v[{x}]
        out = torch._addmm_activation(v[{bias}], {rows}, {w}, use_gelu={gelu})
        return {out}
"""


def select_tasks(names: str, matmuls: bool = False, part: int = 1, parts: int = 1) -> list:
    """The suite tasks a run takes: those `names` lists (comma-separated, in that order: a run cut
    short has judged those first), every one but the convolutions with `matmuls`, all where neither
    says; then every `parts`-th of them from the `part`-th (1-based)."""
    order = [n for n in names.split(",") if n]
    unknown = set(order) - {t.name for t in GEMM_SUITE}
    if unknown:
        raise SystemExit(f"bench_gemm: no suite task {', '.join(sorted(unknown))}")
    tasks = sorted((t for t in GEMM_SUITE if t.name in order or (matmuls and t.category != "conv") or not (order or matmuls)),
                   key=lambda t: order.index(t.name) if t.name in order else len(order))
    return tasks[part - 1::parts]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="", help="suite task names, comma-separated (default: all)")
    parser.add_argument("--matmuls", action="store_true", help="every suite task but the convolutions (with --tasks: those too)")
    parser.add_argument("--part", default="1/1", help="I/N: every N-th of the tasks from the I-th, in the suite's order "
                        "(a run over several device calls)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--builds", default="", help="the judge's build folder (default: a fresh temporary one)")
    parser.add_argument("--peers", default="max-autotune,cublaslt",
                        help="peers timed against each task's best tiling, in the same judge (comma-separated; '' for none)")
    parser.add_argument("--first", type=int, default=0,
                        help="each task's first N tilings only, as a search of N turns tries them, and its first N wide ends (default: all)")
    parser.add_argument("--extra-tilings", action="store_true",
                        help=f"also try the 16-bit tilings the search does not ({len(EXTRA_TILINGS)}: other clusters, ping-pong 128x128)")
    parser.add_argument("--tail-tilings", action="store_true",
                        help=f"also try the 16-bit tilings of TAIL_TILINGS ({len(TAIL_TILINGS)}: stream-K's last waves, "
                             "a wider epilogue subtile)")
    parser.add_argument("--orders", action="store_true",
                        help=f"also try each task's first tiling with {len(ORDERS)} other orders of its tiles' work (swizzle, raster)")
    parser.add_argument("--precise", action="store_true",
                        help="also judge each task's first tiling with the precise math where its program takes the device's "
                             "(every output 16-bit: gemm_kernel.FAST_MATH), beside it in the same run")
    parser.add_argument("--arch", choices=("sm90", "sm80"), default="",
                        help="the GEMM kernels to plan: Hopper's (sm90) or CUTLASS 2.x's (sm80, Ampere's, which run on Hopper too); "
                             "default: the GPU's")
    parser.add_argument("--cudnn-tf32", choices=("on", "off"), default="on",
                        help="the numerics the tasks are planned, judged and timed under: cuDNN's float32 convolutions in TF32 "
                             "(on: torch's default, under which the writer declines a float32 implicit GEMM) or in float32 (off)")
    parser.add_argument("--matmul-tf32", choices=("on", "off"), default="off",
                        help="the same for cuBLAS's float32 matmuls: in float32 (off: torch's default) or in TF32 (on: "
                             "torch.set_float32_matmul_precision('high'), as torch.compile suggests)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.peers = [p for p in args.peers.split(",") if p]
    part, _, parts = args.part.partition("/")
    if not (part.isdigit() and parts.isdigit() and 1 <= int(part) <= int(parts)):
        parser.error(f"--part {args.part!r}: I/N with 1 <= I <= N")
    part, parts = int(part), int(parts)
    unknown = set(args.peers) - {"max-autotune", "cublaslt"}
    if unknown:
        parser.error(f"unknown peers: {', '.join(sorted(unknown))} (max-autotune, cublaslt)")
    from kevin_backend.generate.builtin.builtin_support import gemm_arch

    args.arch = args.arch or gemm_arch()
    if not gemm_arch() or (args.arch == "sm90" and gemm_arch() != "sm90"):
        print(f"bench_gemm: needs a {'Hopper GPU (sm_90a)' if args.arch == 'sm90' else 'GPU of compute capability 8.0 or later'}",
              file=sys.stderr)
        return 2
    capability = "%d.%d" % torch.cuda.get_device_capability()
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.sandbox import RunConfig
    from kevin_backend.toolchain.build import BuildSpec
    from kevin_backend.toolchain.candidate import Candidate
    from kevin_backend.toolchain.cutlass_headers import find_cutlass

    if find_cutlass() is None:
        print("bench_gemm: CUTLASS's headers are not installed (pip install 'kevin_backend[cutlass]')", file=sys.stderr)
        return 2
    tasks = select_tasks(args.tasks, args.matmuls, part, parts)
    plans: dict[str, AnyGemm] = {}
    declined: dict[str, str] = {}
    for t in tasks:
        plan = plan_gemm(t.source, arch=args.arch, conv_tf32=args.cudnn_tf32 == "on", matmul_tf32=args.matmul_tf32 == "on")
        if isinstance(plan, GEMM_PLANS):
            plans[t.name] = plan
        else:
            declined[t.name] = plan.reason
    sources = {t.name: t.source for t in tasks}
    def tilings(plan: AnyGemm) -> tuple:
        own = first_tilings(plan, args.first)
        more = (EXTRA_TILINGS if args.extra_tilings else ()) + (TAIL_TILINGS if args.tail_tilings else ())
        return own + tuple(t for t in more if t not in own and hopper_takes(plan, t)) + (order_variants(own[0]) if args.orders and own else ())

    programs = candidate_programs(plans, sources, tilings, args.precise)
    builds = Path(args.builds) if args.builds else Path(__import__("tempfile").mkdtemp(prefix="kevin-gemm-"))
    base = judge = Judge(builds, RunConfig(trials=args.trials))  # (held: the views below share its worker pool, which it closes when let go)
    # (the judge's workers apply them to eager, Inductor and the peers)
    numerics = {"cudnn_tf32": args.cudnn_tf32 == "on", "matmul_tf32": args.matmul_tf32 == "on"}
    if not numerics["cudnn_tf32"] or numerics["matmul_tf32"]:
        judge = judge.configured(numerics=tuple(numerics.items()))
    specs = [BuildSpec.of(ext, capability) for p in programs.values() for ext in Candidate.parse(p).extensions]
    start = time.perf_counter()
    built = judge.builder.build_many(specs)
    build_wall = time.perf_counter() - start
    print(f"built {len(specs)} programs in {build_wall:.0f} s ({judge.builder.jobs} at a time): "
          f"median {statistics.median(r.seconds for r in built):.1f} s each, "
          f"{sum(r.ok for r in built)} ok, how: {sorted({getattr(r, 'how', '?') for r in built})}", flush=True)
    rows: list[dict] = []

    def save() -> None:  # after every row: a run cut short keeps what it judged
        if args.json:
            args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "arch": args.arch,
                                             "build_seconds": [r.seconds for r in built], "build_wall_s": build_wall,
                                             "rows": rows, "declined": declined, "numerics": numerics}, indent=1))

    def judged(name: str, tiling: str, peer: str, judge_: Judge, task_source: str) -> dict:
        began = time.perf_counter()
        result = judge_.judge(task_source, programs[(name, tiling)])
        t = result.timings
        # the peer's time: Inductor's (default or max-autotune) or, for cuBLASLt, the task's eager time
        peer_ms = t.eager_ms if peer == "cublaslt" else t.inductor_ms
        row = {"task": name, "plan": plans[name].describe(), "tiling": tiling, "peer": peer, "verdict": result.reason.name,
               "kernel_ms": t.kernel_ms, "inductor_ms": t.inductor_ms, "eager_ms": t.eager_ms, "peer_ms": peer_ms,
               "x_peer": (peer_ms / t.kernel_ms) if t.kernel_ms and peer_ms else None,
               "exact": result.exact, "seconds": round(time.perf_counter() - began, 1), "feedback": result.feedback[:300],
               # the input sets that passed only on the comparison's second opinion (`measure/compare.py`)
               "second_opinion": [n for n in (result.memory or {}).get("notes", []) if "second opinion" in n]}
        row["x_inductor"] = row["x_peer"] if peer == "inductor" else None
        rows.append(row)
        save()
        return row

    autotuned = judge.configured(numerics=tuple(sorted({**max_autotune_numerics(), **numerics}.items())))
    count = 0
    for name, plan in plans.items():
        source = next(t.source for t in tasks if t.name == name)
        mine = []
        for tiling in [t.name for t in tilings(plan)] + [t for n, t in programs if n == name and t.endswith(PRECISE)]:
            count += 1
            row = judged(name, tiling, "inductor", judge, source)
            mine.append(row)
            x = f"{row['x_peer']:.3f}x Inductor" if row["x_peer"] else "-"
            print(f"[{count}/{len(programs)}] {name} {tiling}: {row['verdict']} {x} ({row['seconds']} s)"
                  + "".join(f"\n    {note}" for note in row["second_opinion"]), flush=True)
        accepted = [r for r in mine if r["verdict"] == "ACCEPTED" and not r["tiling"].endswith(PRECISE)]
        if not accepted:
            continue
        best = min(accepted, key=lambda r: r["kernel_ms"])
        for peer in args.peers:
            peer_source = source if peer == "max-autotune" else cublaslt_task(source, plan)
            if peer_source is None:
                continue  # cuBLASLt has no fused epilogue for this one
            row = judged(name, best["tiling"], peer, autotuned if peer == "max-autotune" else judge, peer_source)
            x = f"{row['x_peer']:.3f}x {peer}" if row["x_peer"] else "-"
            print(f"  {name} best tiling against {peer}: {row['verdict']} {x} ({row['seconds']} s)", flush=True)
    best_rows = {}
    for row in rows:
        if row["peer"] == "inductor" and row["verdict"] == "ACCEPTED" and not row["tiling"].endswith(PRECISE) and (
                row["task"] not in best_rows or row["kernel_ms"] < best_rows[row["task"]]["kernel_ms"]):
            best_rows[row["task"]] = row
    peer_x = {(r["task"], r["peer"]): r["x_peer"] for r in rows if r["peer"] != "inductor" and r["verdict"] == "ACCEPTED"}
    print("\n| task | plan | best tiling | kernel ms | Inductor ms | x Inductor | x max-autotune | x cuBLASLt |\n"
          "|---|---|---|---|---|---|---|---|")
    for name in plans:
        r = best_rows.get(name)
        peers = " | ".join(f"{peer_x[(name, p)]:.3f}x" if peer_x.get((name, p)) else "-" for p in ("max-autotune", "cublaslt"))
        print(f"| {name} | {plans[name].describe()} | " + (f"{r['tiling']} | {r['kernel_ms']:.4f} | {r['inductor_ms']:.4f} | "
                                                            f"{r['x_inductor']:.3f}x | {peers} |" if r else "none accepted | - | - | - | - | - |"))
    xs = [r["x_inductor"] for r in best_rows.values() if r["x_inductor"]]
    if xs:
        print(f"geomean over {len(xs)} tasks: {statistics.geometric_mean(xs):.3f}x Inductor; worst {min(xs):.3f}x")
    # the convolution goal's tasks: those whose epilogue moves at least a fifth of the convolution's bytes
    shares = {name: epilogue_share(sources[name]) for name in best_rows}
    conv_xs = [best_rows[n]["x_inductor"] for n, share in shares.items() if share is not None and share >= 0.2
               and best_rows[n]["x_inductor"]]
    if conv_xs:
        print(f"convolutions whose epilogue moves at least a fifth of their bytes: geomean over {len(conv_xs)} tasks "
              f"{statistics.geometric_mean(conv_xs):.3f}x Inductor (goal 1.1x); worst {min(conv_xs):.3f}x")
    for name, reason in declined.items():
        print(f"declined {name}: {reason}")
    save()
    base.close()  # (its workers, which the views shared)
    return 0


if __name__ == "__main__":
    sys.exit(main())
