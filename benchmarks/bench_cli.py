"""Start-up time of the `kevin` command line: help texts and usage errors, each run N times in a
fresh interpreter (as hyperfine does), with the bare interpreter's start for scale.

    python -c pass                       the floor: Python itself
    kevin --help                         the top-level parser
    kevin generate --help                a subcommand's parser
    kevin cache ls --help                a nested subcommand's parser
    kevin generate --no-such-option      a usage error (argparse, exit 2)

Each runs as `python -m kevin_backend.cli.main ...` with this interpreter (no shell or shim in the
time). Prints median, min and max seconds per command, and whether torch was imported (`-X
importtime` of one extra run).

Usage: python benchmarks/bench_cli.py [--runs 10] [--warmup 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

CLI = (sys.executable, "-m", "kevin_backend.cli.main")

# (name, command line, expected exit code)
CASES: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("python -c pass", (sys.executable, "-c", "pass"), 0),
    ("kevin --help", (*CLI, "--help"), 0),
    ("kevin generate --help", (*CLI, "generate", "--help"), 0),
    ("kevin cache ls --help", (*CLI, "cache", "ls", "--help"), 0),
    ("kevin generate --no-such-option", (*CLI, "generate", "--no-such-option"), 2),
)


def run_once(command: tuple[str, ...], expected: int) -> float:
    """Seconds one run of `command` takes, start to exit; fails on another exit code."""
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != expected:
        raise SystemExit(f"{' '.join(command)}: exit {done.returncode}, expected {expected}\n{done.stderr[-2000:]}")
    return seconds


def imports_torch(command: tuple[str, ...]) -> bool:
    """Whether `command` imports torch (its `-X importtime` lines name the module)."""
    if command[1] != "-m":
        return False
    done = subprocess.run((command[0], "-X", "importtime", *command[1:]), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    return any(line.rsplit("|", 1)[-1].strip() == "torch" for line in done.stderr.splitlines())


def measure(runs: int, warmup: int) -> list[dict[str, object]]:
    """Per case: the timings of `runs` runs after `warmup` untimed ones, and their summary."""
    rows = []
    for name, command, expected in CASES:
        for _ in range(warmup):
            run_once(command, expected)
        times = [run_once(command, expected) for _ in range(runs)]
        rows.append({"command": name, "exit_code": expected, "runs": runs, "median_s": statistics.median(times),
                     "min_s": min(times), "max_s": max(times), "times_s": times, "imports_torch": imports_torch(command)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="timed runs per command (default 10)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first, to warm the file cache (default 1)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args()
    rows = measure(args.runs, args.warmup)
    width = max(len(str(row["command"])) for row in rows)
    print(f"{'command':<{width}}  median s   min s   max s  torch")
    for row in rows:
        print(f"{row['command']:<{width}}  {row['median_s']:8.3f} {row['min_s']:7.3f} {row['max_s']:7.3f}  "
              f"{'yes' if row['imports_torch'] else 'no'}")
    if args.json:
        meta = {"python": platform.python_version(), "machine": platform.machine(), "runs": args.runs, "warmup": args.warmup}
        args.json.write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
