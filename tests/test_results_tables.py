"""benchmarks/results/ and benchmarks/tables.py: every stored result carries its metadata, the
script runs on all of them, and RESULTS.md's marked tables are what the JSON gives (CPU only)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SCRIPT = BENCH / "tables.py"
STORED = sorted((BENCH / "results").glob("*.json"))


def _tables():
    spec = importlib.util.spec_from_file_location("bench_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


tables = _tables()


def test_the_results_folder_holds_the_stored_runs() -> None:
    assert [p.name for p in STORED] == [
        "builtin_dims_h200.json", "builtin_roofline_h200.json", "builtin_roofline_h200_run10.json",
        "builtin_roofline_h200_run11.json", "builtin_roofline_h200_run13_crossentropy_bf16.json", "builtin_roofline_h200_run4.json", "builtin_roofline_h200_run5_clusters_first.json",
        "builtin_roofline_h200_run6.json", "builtin_roofline_h200_run7.json", "builtin_roofline_h200_run8.json",
        "builtin_roofline_h200_run9.json", "cli_startup_2cpu.json", "cold_variant_h100_c91f2b4.json", "cold_variant_h100_e1c3c68.json", "cold_variant_phases_2cpu.json", "cudnn_peer_h100_1d27afa.json", "cudnn_peer_h200_1d27afa.json", "gemm_conv_h200_624a848.json", "gemm_conv_h200_81c8c46.json", "gemm_f32_convs_cudnn_fp32_h100_b0747e9.json", "gemm_peers_h100_5cc63ab.json", "gemm_peers_h100_b551117.json", "gemm_peers_h200_e180542.json", "gemm_peers_qkv_h100_0a82aff.json", "gemm_suite_h100_0ef9d03.json", "gemm_suite_h100_1d27afa.json", "gemm_suite_h100_664624b.json", "gemm_suite_h100_cf0ee46.json", "gemm_suite_h100_de18051.json", "gemm_suite_h100_ea61210.json", "gemm_suite_h100_fd03cae.json", "gemm_suite_h200_90306a1.json", "gemm_suite_h200_97fc419.json", "gemm_suite_h200_cd5cd0f.json", "gemm_suite_h200_ddcf3f9.json", "gemm_suite_h200_e180542.json", "gemm_suite_h200_e688c71.json", "gemm_suite_h200_f136917.json", "gemm_tail_h100_b551117.json", "gemm_tf32_matmuls_h100_b0747e9.json", "gemm_variants_h200_e180542.json", "gpu_tests_0012c83_h200.json", "gpu_tests_16bit_h200.json", "gpu_tests_1d27afa_h100.json", "gpu_tests_1d27afa_h200.json", "gpu_tests_1ef6dee_h200.json", "gpu_tests_5cc63ab_h100.json", "gpu_tests_5eca883_h200.json", "gpu_tests_81c8c46_h200.json", "gpu_tests_8466961_h100.json", "gpu_tests_9e249fa_h200.json", "gpu_tests_b9da417_h200.json", "gpu_tests_ddcf3f9_h200.json", "gpu_tests_e688c71_h200.json", "gpu_tests_ea61210_h100.json", "gpu_tests_f136917_h200.json", "gpu_tests_memory_h200.json", "gpu_tests_retime_sequential_h200.json", "inductor_forms_h200.json", "isolation_gpu_tests_h200.json", "isolation_judge_cases_h200.json", "isolation_speed_h200.json",
        "isolation_speed_h200_run2.json", "isolation_speed_h200_run3.json", "isolation_speed_h200_run4.json", "judge_corpus_h200.json",
        "judge_speed_h200.json", "kevin_bench_gpt2_bf16_h100_387c252.json", "kevin_bench_gpt2_bf16_h100_387c252_second.json", "kevin_bench_gpt2_bf16_h100_95fdf32.json", "kevin_bench_gpt2_bf16_h100_95fdf32_second.json", "kevin_bench_gpt2_bf16_h100_a3f236d.json", "kevin_bench_gpt2_bf16_h100_empty_6d08784.json",
        "kevin_bench_llama_bf16_h100_387c252.json", "kevin_bench_llama_bf16_h100_95fdf32.json",
        "kevin_bench_models_h200.json", "layers_gpu_tests_h200.json", "op_overhead_direct_h200.json",
        "op_overhead_h200.json", "prewarm_budget_gpt2_h200.json", "rl_h200.json", "roofline_backend_h200.json",
        "roofline_backend_h200_run2.json", "roofline_backend_h200_run3.json", "roofline_backend_h200_run4.json",
        "roofline_backend_h200_run5.json", "roofline_backend_h200_run6.json", "roofline_backend_h200_run7.json",
        "roofline_backend_h200_run8.json",
    ]
    assert not list(BENCH.glob("*.json")), "result JSON belongs in benchmarks/results/, with its metadata"


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.name)
def test_every_stored_result_has_its_metadata(path: Path) -> None:
    stored = json.loads(path.read_text())
    assert set(stored) == {"meta", "data"}
    meta = stored["meta"]
    for field in ("date", "gpu", "torch", "cuda", "command", "kind"):
        assert meta.get(field), f"{path.name}: meta.{field} missing"
    assert isinstance(meta.get("gpu_count"), int), f"{path.name}: meta.gpu_count missing"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", meta["date"])
    cpu_only = meta["gpu_count"] == 0 and meta["cuda"] == "none"  # a run on a machine without a GPU, said so
    assert (cpu_only or re.fullmatch(r"\d+\.\d+", meta["cuda"])) and meta["torch"].startswith("2.")
    assert cpu_only or meta["gpu_count"] >= 1
    assert meta["kind"] in tables.KINDS and stored["data"]
    blocks = tables.blocks_of(path)
    assert blocks and all(text.strip() for text in blocks.values())


def test_the_script_runs_on_every_stored_result() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for path in STORED:
        assert f"## {path.name}: " in done.stdout
    assert "| **overhead of the op over a bare launch** |  |  | **5.62** |" in done.stdout


def test_results_md_agrees_with_the_stored_json() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (BENCH / "RESULTS.md").read_text()
    for path in STORED:  # every stored file is linked and shows its blocks
        assert f"(results/{path.name})" in text and f"<!-- table: {path.name} " in text
    for link in re.findall(r"\]\(([^)]+\.json)\)", text):
        assert (BENCH / link).is_file(), link


def test_sections_without_stored_json_say_so() -> None:
    text = (BENCH / "RESULTS.md").read_text()
    sections = re.split(r"\n(?=## )", text)[1:]
    for section in sections:
        heading = section.splitlines()[0]
        stored = "results/" in section and "<!-- table:" in section
        assert stored or "Not reproducible from stored files: measured before results were stored" in section, heading


def test_check_fails_on_a_changed_figure_or_missing_metadata(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    stored = json.loads((BENCH / "results" / "op_overhead_h200.json").read_text())
    (folder / "op.json").write_text(json.dumps(stored))
    made = tables.blocks_of(folder / "op.json")["calls"]
    page = tmp_path / "RESULTS.md"
    page.write_text(f"# r\n\n<!-- table: op.json calls -->\n{made}<!-- /table -->\n")

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(SCRIPT), "--check", "--results", str(page), "--folder", str(folder)],
                              capture_output=True, text=True, timeout=120)

    assert check().returncode == 0
    page.write_text(page.read_text().replace("13.22", "12.00"))
    done = check()
    assert done.returncode == 1 and "-| `torch.ops.kevin.launch.default(key, [x, y], False)` | 13.69 | 12.00" in done.stdout

    del stored["meta"]["cuda"]
    (folder / "op.json").write_text(json.dumps(stored))
    done = check()
    assert done.returncode == 1 and "op.json: meta lacks cuda" in done.stderr

    assert subprocess.run([sys.executable, str(SCRIPT), "--write", "--results", str(page), "--folder", str(folder)],
                          capture_output=True, text=True, timeout=120).returncode == 1


def test_wrap_stores_a_run_with_its_metadata(tmp_path: Path) -> None:
    raw = tmp_path / "overhead.json"
    raw.write_text(json.dumps(json.loads((BENCH / "results" / "op_overhead_h200.json").read_text())["data"]))
    out = tmp_path / "op_overhead_new.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "wrap", str(raw), "--kind", "op_overhead", "--date", "2026-12-02", "--gpu",
         "NVIDIA H200", "--torch", "2.11.0+cu130", "--cuda", "13.0", "--command",
         "python3 benchmarks/bench_op_overhead.py --json overhead.json", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    meta, data = tables.load(out)
    assert meta["date"] == "2026-12-02" and meta["gpu_count"] == 1 and data["summary"]["op_overhead_us"] > 0


def test_the_bench_summary_names_the_cells_below_inductor() -> None:
    def row(model: str, ratio: float, interval: tuple[float, float], hits: int = 0, dropped: int = 0) -> dict:
        timing = {c: {"median_ms": 1.0} for c in ("eager", "inductor", "kevin")}
        return {"model": model, "size": "full", "dtype": "float32", "workload": "infer", "timings": timing,
                "kevin_vs_inductor": ratio, "kevin_vs_inductor_paired": [ratio, *interval],
                "kevin": {"hits": hits, "dropped": dropped}}

    blocks = tables.kevin_bench({"models": [row("a", 1.02, (0.99, 1.05), hits=3, dropped=1), row("b", 0.985, (0.97, 1.01)),
                                            row("c", 0.95, (0.93, 0.97))]})
    assert "3 cells; kevin over Inductor (median step times) from 0.950x (c full float32 infer)" in blocks["summary"]
    assert "cells below 0.99x: c full float32 infer, b full float32 infer;" in blocks["summary"]
    assert "lies wholly below 1.00: c full float32 infer." in blocks["summary"]
    assert "| 1.020x [0.99-1.05] | 3 hit, 1 dropped by the graph check |" in blocks["cells"]


def test_the_gemm_suite_table_takes_each_task_from_the_last_run_that_judged_it() -> None:
    def row(task: str, tiling: str, peer: str, x: float, ms: float) -> dict:
        return {"task": task, "plan": "p", "tiling": tiling, "peer": peer, "verdict": "ACCEPTED", "kernel_ms": ms,
                "inductor_ms": ms * x, "x_peer": x}

    runs = [{"tree": "aaa", "rows": [row("a", "t1", "inductor", 0.5, 2.0), row("a", "t1", "max-autotune", 0.4, 2.0),
                                     row("b", "t1", "inductor", 1.2, 1.0), row("b", "t2", "inductor", 1.5, 0.8)]},
            {"tree": "bbb", "rows": [row("a", "t3", "inductor", 1.3, 1.5), row("a", "t4", "inductor", 1.1, 1.7)]}]
    blocks = tables.gemm_suite({"runs": runs})
    lines = blocks["tasks"].splitlines()[2:]
    assert lines == ["| a | bbb | p | t3 | 1.5000 | 1.9500 | 1.300x | - | - |",  # (run aaa's row and peer replaced)
                     "| b | aaa | p | t2 | 0.8000 | 1.2000 | 1.500x | - | - |"]
    assert blocks["summary"].startswith("2 tasks: geomean 1.396x Inductor, worst 1.300x (a)")
    assert "matmuls:" not in blocks["summary"]  # (no convolution: one line)
    # a convolution beside them: each kind's geomean and worst on a line of its own
    conv = dict(row("c", "t1", "inductor", 0.25, 4.0), plan="128x64x576 float16, a 3x3 2-D convolution")
    blocks = tables.gemm_suite({"runs": runs + [{"tree": "ccc", "rows": [conv]}]})
    assert blocks["summary"].splitlines()[1] == ("matmuls: 2 tasks, geomean 1.396x Inductor, worst 1.300x (a); "
                                                 "convolutions: 1 tasks, geomean 0.250x Inductor, worst 0.250x (c)")
    # a precise-math row is a comparison, never the best; a task whose last run accepted nothing is named
    refused = dict(row("b", "t1", "inductor", 2.0, 0.5), verdict="MISMATCH")
    runs.append({"tree": "ddd", "rows": [row("a", "t3", "inductor", 1.2, 1.6), row("a", "t3 (precise math)", "inductor", 9.0, 0.2),
                                         refused]})
    blocks = tables.gemm_suite({"runs": runs})
    assert blocks["tasks"].splitlines()[2:] == ["| a | ddd | p | t3 | 1.6000 | 1.9200 | 1.200x | - | - |"]
    assert blocks["summary"].splitlines()[-1] == "no tiling accepted in the last run that judged it: b"
    assert blocks["math"].splitlines()[2:] == ["| a | ddd | t3 | 1.200x | 9.000x |"]


def test_the_cudnn_peer_table_says_what_ran_and_why_not() -> None:
    def ran(task: str, x: float) -> dict:
        return {"task": task, "recipe": "conv stride 1x1 -> add -> relu", "cudnn": "ran", "cudnn_ms": 1.0, "inductor_ms": x,
                "eager_ms": 2.0, "x_inductor": x}

    data = {"cudnn": 91000, "frontend": "1.32.0", "allow_tf32": True,
            "rows": [ran("a", 1.2), ran("b", 0.5), {"task": "c", "cudnn": "not taken", "cudnn_note": "amax after the convolution"},
                     {"task": "d", "cudnn": "failed", "cudnn_note": "cudnnGraphNotSupportedError: no engine"}]}
    blocks = tables.cudnn_peer(data)
    lines = blocks["tasks"].splitlines()[2:]
    assert lines[0] == "| a | conv stride 1x1 -> add -> relu | 1.0000 | 1.2000 | 2.0000 | 1.200x |"
    assert lines[3] == "| d | failed: cudnnGraphNotSupportedError: no engine | - | - | - | - |"
    assert blocks["summary"] == ("2 of 4 graphs ran: geomean 0.775x Inductor, worst 0.500x (b); 1 at or above Inductor; "
                                 "cuDNN 91000, frontend 1.32.0, TF32 allowed\n")
    assert tables.cudnn_peer({"rows": data["rows"][2:]})["summary"] == "no graph ran of 2\n"
