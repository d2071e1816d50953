"""The numerics settings in the cache key (schema 2): which settings a task's key records, that
flipping one changes exactly the keys it bears on, that the legacy/new TF32 APIs mixed do not
break key making, and that the seed cache (made under torch's defaults) still hits (CPU only)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kevin_backend.cache import SCHEMA_VERSION, CacheKey, DeviceInfo, KernelCache, make_key
from kevin_backend.cache.key import NUMERICS_DOC, default_numerics, numerics_settings
from kevin_backend.cache.store import default_seed_dir
from kevin_backend.types import KernelTask, TensorSpec

H200 = DeviceInfo("NVIDIA H200", "9.0", "2.11.0", "13.0")
SPEC = TensorSpec(shape=(64, 64), stride=(64, 1), dtype="float32", device="cuda")


def task(*ops: str) -> KernelTask:
    return KernelTask(name="t", source="# task\n", inputs=(SPEC, SPEC), outputs=(SPEC,), ops=ops, graph_hash="g" * 32)


POINTWISE = task("aten.mul.Tensor", "prims.convert_element_type.default", "aten.relu.default")
NORM = task("aten.var_mean.correction", "aten.rsqrt.default", "aten.mul.Tensor")
MATMUL = task("aten.addmm.default", "aten.gelu.default")
CONV = task("aten.convolution.default", "aten.relu.default")


def test_each_task_records_the_settings_its_ops_depend_on() -> None:
    assert set(numerics_settings(POINTWISE.ops)) == {"deterministic_algorithms"}
    assert set(numerics_settings(NORM.ops)) == {"deterministic_algorithms"}
    assert set(numerics_settings(MATMUL.ops)) == {
        "deterministic_algorithms", "matmul_tf32", "float32_matmul_precision",
        "fp16_reduced_precision_reduction", "bf16_reduced_precision_reduction",
    }
    assert set(numerics_settings(CONV.ops)) == {"deterministic_algorithms", "cudnn_enabled", "cudnn_tf32", "cudnn_deterministic",
                                                "cudnn_benchmark"}
    # every setting documented; Inductor's config only where it is not the default
    assert set(NUMERICS_DOC) == set(default_numerics(MATMUL.ops + CONV.ops)) | {"inductor_config"}


def test_this_process_runs_under_torchs_defaults() -> None:
    every = MATMUL.ops + CONV.ops
    assert numerics_settings(every) == default_numerics(every)


@pytest.fixture
def restore_flags():
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, torch.get_float32_matmul_precision(), matmul.allow_fp16_reduced_precision_reduction,
             cudnn.enabled, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark,
             torch.are_deterministic_algorithms_enabled())
    yield
    matmul.allow_tf32 = saved[0]
    torch.set_float32_matmul_precision(saved[1])
    matmul.allow_fp16_reduced_precision_reduction = saved[2]
    cudnn.enabled, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = saved[3:7]
    torch.use_deterministic_algorithms(saved[7])


def digests() -> dict[str, str]:
    return {name: make_key(t, H200).digest for name, t in
            (("pointwise", POINTWISE), ("norm", NORM), ("matmul", MATMUL), ("conv", CONV))}


@pytest.mark.parametrize(
    "flip, changed",
    [
        pytest.param(lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True), {"matmul"}, id="matmul-tf32"),
        pytest.param(lambda: torch.set_float32_matmul_precision("high"), {"matmul"}, id="precision-high"),
        pytest.param(lambda: torch.set_float32_matmul_precision("medium"), {"matmul"}, id="precision-medium"),
        pytest.param(lambda: setattr(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction", False),
                     {"matmul"}, id="fp16-reduction"),
        pytest.param(lambda: setattr(torch.backends.cudnn, "allow_tf32", False), {"conv"}, id="cudnn-tf32"),
        pytest.param(lambda: setattr(torch.backends.cudnn, "enabled", False), {"conv"}, id="cudnn-enabled"),
        pytest.param(lambda: setattr(torch.backends.cudnn, "deterministic", True), {"conv"}, id="cudnn-deterministic"),
        pytest.param(lambda: torch.use_deterministic_algorithms(True), {"pointwise", "norm", "matmul", "conv"},
                     id="deterministic-algorithms"),
        pytest.param(lambda: setattr(torch.backends.cudnn, "benchmark", True), {"conv"}, id="cudnn-benchmark"),
    ],
)
def test_a_flipped_setting_changes_exactly_the_keys_it_bears_on(restore_flags, flip, changed: set[str]) -> None:
    before = digests()
    flip()
    after = digests()
    assert {name for name in before if before[name] != after[name]} == changed


def test_keys_are_read_at_each_call_not_cached(restore_flags) -> None:
    first = make_key(MATMUL, H200)
    torch.backends.cuda.matmul.allow_tf32 = True
    second = make_key(MATMUL, H200)
    assert dict(second.numerics)["matmul_tf32"] is True and second != first
    torch.backends.cuda.matmul.allow_tf32 = False
    assert make_key(MATMUL, H200) == first


def test_the_new_tf32_api_mixed_with_the_legacy_one_still_makes_keys() -> None:
    # torch's legacy getters raise once both APIs were used; a fresh process keeps this one clean
    script = textwrap.dedent(
        """
        import json, torch
        from kevin_backend.cache.key import numerics_settings
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        print(json.dumps(numerics_settings(["aten.mm.default", "aten.convolution.default"])))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    settings = json.loads(done.stdout.strip().splitlines()[-1])
    assert settings["matmul_tf32"] is True and settings["float32_matmul_precision"] in ("high", "medium")


def test_schema_2_keys_print_their_numerics_and_schema_1_keys_keep_their_digest() -> None:
    key = make_key(MATMUL, H200)
    data = key.as_dict()
    assert data["schema"] == SCHEMA_VERSION == 2 and data["numerics"]["matmul_tf32"] is False
    assert CacheKey.from_dict(json.loads(json.dumps(data))) == key
    old = {k: v for k, v in data.items() if k != "numerics"} | {"schema": 1}
    assert CacheKey.from_dict(old).as_dict() == old  # the dict (and so the digest) schema 1 wrote
    with pytest.raises(TypeError):
        CacheKey.from_dict({**data, "numerics": {"matmul_tf32": [1]}})


def test_an_old_entry_is_stale_not_misread(tmp_path: Path) -> None:
    from test_cache import make_entry
    from test_cache_prune import schema1_folder

    entry = make_entry(0)
    cache = KernelCache(tmp_path / "c", seed_dir=None)
    old = schema1_folder(cache.cache_dir / "entries", entry)
    assert cache.get(entry.key) is None and cache.get_digest(old) is None
    (info,) = cache.entries()
    assert info.digest == old and "stale entry: key schema 1" in (info.error or "")


SEED = default_seed_dir()
SEED_ENTRIES = sorted(p for p in SEED.iterdir() if p.is_dir() and len(p.name) == 32) if SEED else []


def test_the_seed_cache_hits_under_default_settings(tmp_path: Path) -> None:
    """The seed was made under torch's defaults (nothing in the prewarm flips a switch): a key
    made now, for the seed's GPU and versions, under this process's (default) settings, names
    every seed entry; with TF32 or determinism switched, its tasks (no matmul, no cuDNN) miss only
    through deterministic_algorithms."""
    assert len(SEED_ENTRIES) == 94
    cache = KernelCache(tmp_path / "user", seed_dir=SEED)
    for folder in SEED_ENTRIES:
        meta = json.loads((folder / "meta.json").read_text())
        k = meta["key"]
        device = DeviceInfo(k["gpu"], k["capability"], k["torch"], k["cuda"])
        entry = cache.get_digest(folder.name)
        assert entry is not None
        key = make_key(entry.task, device)
        assert key.digest == folder.name and cache.get(key) == entry
        assert dict(key.numerics) == {"deterministic_algorithms": False}


def test_tf32_on_does_not_orphan_the_seed(tmp_path: Path, restore_flags) -> None:
    torch.set_float32_matmul_precision("high")  # what torch.compile suggests on a GPU with TF32
    torch.backends.cudnn.allow_tf32 = False
    folder = SEED_ENTRIES[0]
    cache = KernelCache(tmp_path / "user", seed_dir=SEED)
    entry = cache.get_digest(folder.name)
    k = entry.key
    assert make_key(entry.task, DeviceInfo(k.gpu, k.capability, k.torch_version, k.cuda_version)).digest == folder.name
