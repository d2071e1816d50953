"""Build times of candidate extensions: the judge's builder against plain `load_inline`.

Candidates are the honest `sigmoid(x) * w + 1` kernel of the judge's tests, each with a different
constant so no build is shared. Measured:

  load_inline   plain torch.utils.cpp_extension.load_inline, default architectures, in a fresh process
  builder full  the judge's Builder, this GPU's architecture only, sources as written
  builder light the same with <torch/types.h> in place of <torch/extension.h> in the CUDA file
  warm          the builder again on a built spec (cache by source hash)
  parallel      16 different candidates at once on all cores (builder light)

Usage: python benchmarks/bench_build.py [--parallel 16] [--skip-load-inline]
"""

from __future__ import annotations

import argparse
import dataclasses
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

from kevin_backend.judge.build import Builder, BuildSpec  # noqa: E402
from kevin_backend.judge.candidate import Candidate  # noqa: E402


def spec(i: int, arch: str | None, light: bool) -> BuildSpec:
    source = HONEST[0].source.replace("+ 1.0f", f"+ {1.0 + i * 1e-3:.4f}f")
    (ext,) = Candidate.parse(source).extensions
    return dataclasses.replace(BuildSpec.of(ext, arch=arch), name=f"gated{i}", light_headers=light)


def plain_load_inline(i: int, root: Path) -> float:
    s = spec(i, None, False)
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
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_build needs a CUDA GPU (it builds for the present architecture)", file=sys.stderr)
        return 2
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}.{minor}"
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if not args.skip_load_inline:
            rows.append(("load_inline, one candidate, cold", plain_load_inline(900, root / "plain")))
            print(rows[-1], file=sys.stderr, flush=True)
        builder = Builder(root / "builds")
        full = builder.build(spec(901, arch, False))
        rows.append(("builder full headers, one candidate, cold", full.seconds))
        print(rows[-1], file=sys.stderr, flush=True)
        light = builder.build(spec(902, arch, True))
        rows.append(("builder light headers, one candidate, cold", light.seconds))
        print(rows[-1], file=sys.stderr, flush=True)
        warm = [builder.build(spec(902, arch, True)).seconds for _ in range(20)]
        rows.append(("builder, one candidate, warm (median of 20)", statistics.median(warm)))
        start = time.perf_counter()
        results = Builder(root / "parallel", jobs=os.cpu_count()).build_many([spec(1000 + i, arch, True) for i in range(args.parallel)])
        wall = time.perf_counter() - start
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        rows.append((f"builder light, {args.parallel} candidates at once: wall", wall))
        rows.append((f"builder light, {args.parallel} at once: median per build", statistics.median(r.seconds for r in results)))
    print(f"GPU {torch.cuda.get_device_name()} (arch {arch}), {os.cpu_count()} cores, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    print("| build | seconds |\n|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
