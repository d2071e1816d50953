"""Every program the built-in writer writes for a set of tasks, every variant, as digests: a check
that a change to the writer's code left its output alone.

    python tools/builtin_programs.py write tools/builtin_tasks.json OUT.json   # digests now
    python tools/builtin_programs.py check tools/builtin_tasks.json OUT.json   # the same again?

The tasks file holds (name, KernelBench source) pairs: the built-in suite, the roofline suite and
the partitions the backend cuts out of 28 published level-1 KernelBench problems. For each task
the record is the plan's decline reason or, per variant, a digest of the program the policy would
write for it, the variant's description, and the ranking `preferred_order` gives (as variant numbers).
"""

from __future__ import annotations

import hashlib
import json
import sys


def _writer():  # type: ignore[no-untyped-def]
    from kevin_backend.generate.builtin.plan import Declined
    from kevin_backend.generate.builtin.planner import plan_task
    from kevin_backend.generate.builtin.program import write_program
    from kevin_backend.generate.builtin.variant_ranking import preferred_order
    from kevin_backend.generate.builtin.variants import variant_number, variants_for

    def programs(source: str) -> dict[str, object]:
        plan = plan_task(source)
        if isinstance(plan, Declined):
            return {"declined": plan.reason}
        variants = variants_for(plan)
        digest = hashlib.sha256(source.encode()).hexdigest()[:10]
        kind = "row" if plan.is_rows else "pointwise"
        out: dict[str, object] = {"order": [variant_number(plan, name) for name in preferred_order(plan)]}
        for i, v in enumerate(variants):
            doc = f"Written by kevin's built-in writer: {kind} kernel, {v.describe()}, variant {i}."
            try:
                text = write_program(plan, v, name=f"kevin_builtin_{digest}_{i}", doc=doc)
            except Exception as exc:  # a variant the plan cannot take
                out[str(i)] = f"error: {type(exc).__name__}: {exc}"
                continue
            out[str(i)] = hashlib.sha256(text.encode()).hexdigest()
        return out

    return programs


def main(argv: list[str]) -> int:
    what, tasks_file, out_file = argv
    programs = _writer()
    tasks = json.load(open(tasks_file))
    now = {name: programs(source) for name, source in tasks if source is not None}
    count = sum(1 for r in now.values() for k, v in r.items() if k not in ("order", "declined") and not str(v).startswith("error"))
    if what == "write":
        json.dump(now, open(out_file, "w"), indent=0, sort_keys=True)
        print(f"{len(now)} tasks, {count} programs written to {out_file}")
        return 0
    before = json.load(open(out_file))
    changed = [(t, k) for t in sorted(set(now) | set(before)) for k in sorted(set(now.get(t, {})) | set(before.get(t, {})))
               if now.get(t, {}).get(k) != before.get(t, {}).get(k)]
    for t, k in changed[:40]:
        print(f"changed: {t} [{k}]: {str(before.get(t, {}).get(k))[:80]} -> {str(now.get(t, {}).get(k))[:80]}")
    print(f"{len(now)} tasks, {count} programs; {len(changed)} differences")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
