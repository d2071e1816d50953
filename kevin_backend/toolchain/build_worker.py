"""Build one extension in this (worker) process: `python -m kevin_backend.toolchain.build_worker FOLDER`.

FOLDER holds spec.json (written by `Builder`); the extension is built into FOLDER/build. The
compiler's output goes to stdout/stderr for the parent to trim; the exit code says whether the
build succeeded. A worker process keeps a crashing or hanging compiler away from the judge.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folder: str) -> int:
    from kevin_backend.lifeline import die_with_parent

    die_with_parent()  # (and its compilers, in its process group)
    from torch.utils.cpp_extension import load_inline

    root = Path(folder)
    spec = json.loads((root / "spec.json").read_text())
    try:
        load_inline(
            name=spec["name"],
            cpp_sources=spec["cpp_sources"],
            cuda_sources=spec["cuda_sources"] or None,
            functions=spec["functions"] or None,
            extra_cflags=spec["extra_cflags"] or None,
            extra_cuda_cflags=spec["extra_cuda_cflags"] or None,
            extra_include_paths=spec.get("extra_include_paths") or None,
            build_directory=str(root / "build"),
            with_cuda=spec["with_cuda"],
            verbose=False,
        )
    except Exception as exc:  # the compiler's output is in the message: hand it to the parent
        print(str(exc), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
