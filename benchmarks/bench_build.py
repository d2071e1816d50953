"""Build times of candidate extensions: the judge's builder against plain `load_inline`.

Candidates are the six honest kernels of the judge's tests (elementwise, reduction, softmax,
matmul tile, fp16, bf16), each made unique by a comment so no build is shared. Measured:

  load_inline   plain torch.utils.cpp_extension.load_inline, default architectures, in a fresh process
  builder full  the judge's whole build: load_inline in a worker, this GPU's architecture only
  builder light the same with <torch/types.h> in place of <torch/extension.h> in the CUDA file
  fast          the judge's default: split build, precompiled header, operators (fast_build.py)
  warm          the builder again on a built spec (cache by source hash)
  parallel      16 different candidates at once on all cores (fast)

Usage: python benchmarks/bench_build.py [--parallel 16] [--skip-load-inline] [--skip-whole] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from judge_cases import HONEST  # noqa: E402

from kevin_backend.toolchain.build import Builder, BuildSpec  # noqa: E402
from kevin_backend.toolchain.candidate import Candidate  # noqa: E402


def spec(i: int, arch: str | None, how: str, case: int = 0) -> BuildSpec:
    """Candidate `case` of the honest suite, made unique by `i` (no two builds share a cache entry)."""
    source = HONEST[case].source.replace("__global__", f"// variant {i}\n__global__", 1)
    (ext,) = Candidate.parse(source).extensions
    return dataclasses.replace(BuildSpec.of(ext, arch=arch), name=f"{ext.name}{i}", fast=how == "fast", light_headers=how != "full")


def plain_load_inline(i: int, root: Path) -> float:
    s = spec(i, None, "full")
    code = (
        "import time, torch\nfrom torch.utils.cpp_extension import load_inline\n"
        f"t = time.perf_counter()\nload_inline(name={s.name!r}, cpp_sources={s.cpp_sources!r}, cuda_sources={s.cuda_sources!r}, "
        f"functions={list(s.functions)!r}, build_directory={str(root)!r})\nprint(time.perf_counter() - t)\n"
    )
    root.mkdir(parents=True, exist_ok=True)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--skip-load-inline", action="store_true")
    parser.add_argument("--skip-whole", action="store_true", help="skip the whole (light/full) builder rows")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_build needs a CUDA GPU (it builds for the present architecture)", file=sys.stderr)
        return 2
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}.{minor}"
    rows: list[tuple[str, float]] = []

    def row(name: str, seconds: float) -> None:
        rows.append((name, seconds))
        print(f"{name}: {seconds:.3f} s", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if not args.skip_load_inline:
            row("plain load_inline, one candidate, cold", plain_load_inline(900, root / "plain"))
        if not args.skip_whole:
            row("builder full (load_inline, this arch only), cold", Builder(root / "whole").build(spec(901, arch, "full")).seconds)
            row("builder light (<torch/types.h> in the CUDA file), cold", Builder(root / "whole").build(spec(902, arch, "light")).seconds)
        builder = Builder(root / "fast")
        first = builder.build(spec(903, arch, "fast"))
        assert first.ok and first.how == "fast", first.error
        row("fast, first build on a machine (includes the one-time precompiled header)", first.seconds)
        cold = []
        for i, case in enumerate(HONEST):
            result = builder.build(spec(910 + i, arch, "fast", HONEST.index(case)))
            assert result.ok and result.how == "fast", (case.name, result.how, result.error)
            cold.append(result.seconds)
            print(f"  fast cold {case.name}: {result.seconds:.2f} s", file=sys.stderr)
        row(f"fast, cold, median over the {len(cold)} honest candidates", statistics.median(cold))
        row(f"fast, cold, slowest of the {len(cold)}", max(cold))
        warm = [builder.build(spec(910, arch, "fast")).seconds for _ in range(20)]
        row("warm (cache by source hash), median of 20", statistics.median(warm))
        start = time.perf_counter()
        results = Builder(root / "fast", jobs=os.cpu_count()).build_many(
            [spec(1000 + i, arch, "fast", i % len(HONEST)) for i in range(args.parallel)])
        wall = time.perf_counter() - start
        assert all(r.ok and r.how == "fast" for r in results), [r.error for r in results if not r.ok]
        row(f"fast, {args.parallel} different candidates at once: wall", wall)
        row(f"fast, {args.parallel} at once: median per build", statistics.median(r.seconds for r in results))
    print(f"GPU {torch.cuda.get_device_name()} (arch {arch}), {os.cpu_count()} cores, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    print("| build | seconds |\n|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(dict(rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
