"""CUTLASS's and CuTe's headers, found at run time (toolchain/cutlass_headers.py): from the installed
package's record of its files, absent when the package is not installed, from KEVIN_CUTLASS_INCLUDE
when it names a folder with cutlass/cutlass.h (a clear error when it does not). The task a model
gets names the headers and their folder when they are there and says nothing of CUTLASS when they
are not; every build the judge makes puts the folder on the compilers' include paths (the fast
build's nvcc and g++, the whole build's load_inline) and keys the build on it; the static rules
let `<cutlass/...>` and `<cute/...>` in, still refuse other headers, and refuse a condition on
CUTLASS's macros (the build sees another branch). One slow test compiles a CUTLASS 2.x GEMM for
sm_80 through the fast build's nvcc command."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from kevin_backend.generate import prompts
from kevin_backend.toolchain import build as build_module
from kevin_backend.toolchain import build_worker, cutlass_headers
from kevin_backend.toolchain.build import BuildSpec, Builder, _spec_dict
from kevin_backend.toolchain.candidate import InlineExtension
from kevin_backend.toolchain.cutlass_headers import CutlassHeaders, CutlassHeadersError, find_cutlass, headers_in
from kevin_backend.toolchain.fast_build import Toolchain, device_command
from kevin_backend.toolchain.static_rules import check_program


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KEVIN_CUTLASS_INCLUDE", raising=False)
    cutlass_headers._installed.cache_clear()
    yield
    cutlass_headers._installed.cache_clear()


def _include(root: Path, version: tuple[int, int, int] = (9, 1, 2), cute: bool = True) -> Path:
    """A folder laid out like CUTLASS's include folder."""
    (root / "cutlass").mkdir(parents=True)
    (root / "cutlass" / "cutlass.h").write_text("#pragma once\n")
    (root / "cutlass" / "version.h").write_text("".join(f"#define CUTLASS_{p} {v}\n" for p, v in zip(("MAJOR", "MINOR", "PATCH"), version)))
    if cute:
        (root / "cute").mkdir()
        (root / "cute" / "tensor.hpp").write_text("#pragma once\n")
    return root


def test_found_through_the_package_record(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    site = tmp_path / "site"
    include = _include(site / "pkg_lib" / "source" / "include")
    files = [Path("pkg_lib/__init__.py"), Path("pkg_lib/source/include/cute/tensor.hpp"),
             Path("pkg_lib/source/include/cutlass/cutlass.h")]
    dist = SimpleNamespace(files=files, version="9.1.2.0", locate_file=lambda f: site / f)
    monkeypatch.setattr(cutlass_headers.metadata, "distribution",
                        lambda name: dist if name == "nvidia-cutlass" else (_ for _ in ()).throw(cutlass_headers.metadata.PackageNotFoundError(name)))
    headers = find_cutlass()
    assert headers == CutlassHeaders(include.resolve(), "9.1.2", True, "nvidia-cutlass 9.1.2.0")


def test_absent_without_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cutlass_headers, "PACKAGE", "kevin-no-such-package")
    assert find_cutlass() is None


def test_the_installed_package_when_there_is_one() -> None:
    headers = find_cutlass()
    if headers is None:
        pytest.skip("nvidia-cutlass is not installed (pip install 'kevin_backend[cutlass]')")
    assert (headers.include / "cutlass" / "gemm" / "device" / "gemm.h").is_file()
    assert headers.cute and (headers.include / "cute" / "tensor.hpp").is_file()
    assert headers.version.count(".") == 2 and headers.source.startswith("nvidia-cutlass ")


def test_cutlass_utilities_beside_the_include_folder_are_on_the_include_path(tmp_path: Path) -> None:
    # CUTLASS 3.x's convolutions include cutlass/util/packed_stride.hpp, which the package and a
    # checkout keep in tools/util/include beside include/
    include = _include(tmp_path / "source" / "include", (4, 2, 0), cute=True)
    headers = cutlass_headers.headers_in(include, "test")
    assert headers.includes == (include.resolve(),)
    util = tmp_path / "source" / "tools" / "util" / "include"
    (util / "cutlass" / "util").mkdir(parents=True)
    assert headers.includes == (include.resolve(), util.resolve())
    installed = find_cutlass()
    if installed is not None:  # (the package's own layout)
        assert len(installed.includes) == 2 and (installed.includes[1] / "cutlass" / "util" / "packed_stride.hpp").is_file()


def test_the_environment_names_the_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    include = _include(tmp_path / "include", (3, 8, 0), cute=False)
    monkeypatch.setenv("KEVIN_CUTLASS_INCLUDE", str(include))
    monkeypatch.setattr(cutlass_headers, "PACKAGE", "kevin-no-such-package")
    assert find_cutlass() == CutlassHeaders(include.resolve(), "3.8.0", False, "KEVIN_CUTLASS_INCLUDE")


@pytest.mark.parametrize(("where", "message"), [("missing", "no such folder"), ("empty", "no cutlass/cutlass.h in it;"),
                                                ("above", "one level down")])
def test_a_wrong_folder_in_the_environment_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str, message: str) -> None:
    (tmp_path / "empty").mkdir()
    _include(tmp_path / "above" / "include")
    monkeypatch.setenv("KEVIN_CUTLASS_INCLUDE", str(tmp_path / where))
    with pytest.raises(CutlassHeadersError, match=message) as caught:
        find_cutlass()
    assert f"KEVIN_CUTLASS_INCLUDE={tmp_path / where}" in str(caught.value)


HEADERS = CutlassHeaders(Path("/opt/cutlass/include"), "4.2.0", True, "nvidia-cutlass 4.2.0.0")


def test_the_task_names_the_headers_and_their_folder(tmp_path: Path) -> None:
    text = prompts.task_message("PROGRAM", "NVIDIA H200", "9.0", cutlass=HEADERS)["content"]
    assert "CUTLASS 4.2.0 and CuTe" in text and "`/opt/cutlass/include`" in text
    assert "<cutlass/gemm/device/gemm.h>" in text and "<cute/tensor.hpp>" in text
    assert text.index("Target GPU") < text.index("CUTLASS") < text.index("Write a program")
    older = headers_in(_include(tmp_path / "include", (2, 11, 0), cute=False), "KEVIN_CUTLASS_INCLUDE")
    no_cute = prompts.task_message("PROGRAM", "NVIDIA H200", "9.0", cutlass=older)["content"]
    assert "CUTLASS 2.11.0 are installed" in no_cute and "CuTe" not in no_cute and "<cute/" not in no_cute


def test_without_the_headers_the_prompt_says_nothing_of_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cutlass_headers, "PACKAGE", "kevin-no-such-package")
    for messages in (prompts.build_messages("PROGRAM", "NVIDIA H200", [], 1 << 20, capability="9.0"),
                     prompts.build_messages("PROGRAM", "NVIDIA H200", [], 1 << 20, cutlass=None)):
        text = "\n".join(m["content"] for m in messages)
        assert "cutlass" not in text.lower() and "cute" not in text.lower()
        assert "Target GPU: NVIDIA H200" in text and "\n\n\n" not in text
    found = prompts.build_messages("PROGRAM", "NVIDIA H200", [], 1 << 20, cutlass=HEADERS)
    assert "/opt/cutlass/include" in found[1]["content"]


def _cuda(includes: str, extra: str = "") -> str:
    return f"""#include <torch/extension.h>
{includes}
{extra}
__global__ void scale(const float* x, float* y, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * 2.0f;
}}
torch::Tensor run(torch::Tensor x) {{
    auto y = torch::empty_like(x);
    int n = x.numel();
    scale<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}}
"""


def _program(cuda: str) -> str:
    return textwrap.dedent('''\
        import torch
        import torch.nn as nn
        from torch.utils.cpp_extension import load_inline

        CUDA = r"""''') + cuda + textwrap.dedent('''\
        """
        ext = load_inline(name="scale_ext", cpp_sources="torch::Tensor run(torch::Tensor x);", cuda_sources=CUDA, functions=["run"])


        class ModelNew(nn.Module):
            def forward(self, x):
                return ext.run(x)
        ''')


def test_the_static_rules_take_cutlass_and_cute_headers() -> None:
    assert check_program(_program(_cuda("#include <cutlass/gemm/device/gemm.h>\n#include <cute/tensor.hpp>"))) == ()
    refused = check_program(_program(_cuda("#include <cutlass/gemm/device/gemm.h>\n#include <unistd.h>")))
    assert [(v.rule, v.message) for v in refused] == [("allowed-headers", "includes unistd.h, which is not an allowed header")]
    hidden = check_program(_program(_cuda("#include <cute/tensor.hpp>", "#if defined(CUTLASS_ARCH_MMA_SM90_SUPPORTED)\nint h = 1;\n#endif")))
    assert [v.rule for v in hidden] == ["cpp-preprocessed"] and "CUTLASS_ARCH_MMA_SM90_SUPPORTED" in hidden[0].message


EXT = InlineExtension("gemm_ext", "int f();", "int f() { return 1; }", ("f",), line=1, bound_to="ext")


def test_every_build_gets_the_include_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(build_module, "find_cutlass", lambda: HEADERS)
    spec = BuildSpec.of(EXT, "8.0")
    assert spec.cutlass == HEADERS and spec.include_dirs == ("/opt/cutlass/include",)
    without = dataclasses.replace(spec, cutlass=None)
    assert without.digest != spec.digest and without.include_dirs == ()
    # the whole build: load_inline's include paths, through the worker's spec.json
    (tmp_path / "spec.json").write_text(json.dumps(_spec_dict(spec)))
    seen: dict = {}
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setattr(cpp_extension, "load_inline", lambda **kw: seen.update(kw))
    assert build_worker.main(str(tmp_path)) == 0
    assert seen["extra_include_paths"] == ["/opt/cutlass/include"]
    # the fast build: nvcc and g++
    tc = Toolchain("c++", "nvcc", ("/torch/include", "/cuda/include"), (), ("-std=c++17",), ("-O3",), "v")
    command = device_command(tc, tmp_path / "d.cu", tmp_path / "d.o", "8.0", ("",), spec.include_dirs)
    assert command[-6:-4] == ["-I/torch/include", "-I/opt/cutlass/include"] and "-gencode=arch=compute_80,code=sm_80" in command
    calls: dict = {}
    monkeypatch.setattr(build_module, "ensure_pch", lambda root, toolchain: tmp_path / "pch.h")
    monkeypatch.setattr(build_module.Toolchain, "detect", staticmethod(lambda: tc))
    monkeypatch.setattr(build_module, "build_fast", lambda *a, **kw: calls.update(kw) or SimpleNamespace(
        ok=False, final=True, error="stopped here", log="", timed_out=False, fallback=""))
    fast = BuildSpec("k", "torch::Tensor run(torch::Tensor x);", _cuda("#include <cute/tensor.hpp>"), ("run",), arch="8.0",
                     cutlass=HEADERS)
    Builder(tmp_path / "builds", pch_root=tmp_path).build(fast)
    assert calls["include_dirs"] == ("/opt/cutlass/include",)


GEMM_CU = """#include <cutlass/gemm/device/gemm.h>
using Gemm = cutlass::gemm::device::Gemm<cutlass::half_t, cutlass::layout::RowMajor, cutlass::half_t, cutlass::layout::ColumnMajor,
    cutlass::half_t, cutlass::layout::RowMajor, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80>;
int run_gemm(int m, int n, int k, const cutlass::half_t* a, const cutlass::half_t* b, cutlass::half_t* c, cudaStream_t s) {
    Gemm op;
    Gemm::Arguments args({m, n, k}, {a, k}, {b, k}, {c, n}, {c, n}, {1.0f, 0.0f});
    return static_cast<int>(op(args, nullptr, s));
}
"""


@pytest.mark.slow
def test_a_cutlass_gemm_compiles_through_the_fast_build_nvcc_command(tmp_path: Path) -> None:
    """The include folder reaches nvcc: a CUTLASS 2.x tensor-core GEMM for sm_80 (about 10 s)."""
    headers = find_cutlass()
    if headers is None or shutil.which("nvcc") is None:
        pytest.skip("needs nvcc and CUTLASS's headers (pip install 'kevin_backend[cutlass]')")
    (tmp_path / "gemm.cu").write_text(GEMM_CU)
    spec = BuildSpec.of(EXT, "8.0")
    command = device_command(Toolchain.detect(), tmp_path / "gemm.cu", tmp_path / "gemm.o", "8.0", (), spec.include_dirs)
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (tmp_path / "gemm.o").stat().st_size > 0


def test_the_builtin_writer_says_why_it_leaves_matmuls_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without the headers the report tells what to install; with them, what else is missing (a
    Hopper GPU for the GEMM; any kernel at all for a convolution)."""
    import torch
    import torch.nn.functional as F
    from torch.fx.experimental.proxy_tensor import make_fx

    from kevin_backend.generate.builtin import builtin_support
    from kevin_backend.generate.builtin.builtin_support import BuiltinSupport

    graph = make_fx(lambda x, w: torch.relu(F.conv2d(x, w)).sum() + torch.mm(x[0, 0], x[0, 1]))(
        torch.randn(1, 3, 4, 4), torch.randn(2, 3, 3, 3)).graph
    nodes = [n for n in graph.nodes if n.target in (torch.ops.aten.mm.default, torch.ops.aten.convolution.default)]
    assert len(nodes) == 2

    def reasons() -> set[str]:
        return {BuiltinSupport().supports(n)[1].split(": ", 1)[1] for n in nodes}

    monkeypatch.setattr(cutlass_headers, "PACKAGE", "kevin-no-such-package")
    assert reasons() == {"CUTLASS's headers are not installed (pip install \"kevin_backend[cutlass]\")"}
    monkeypatch.setenv("KEVIN_CUTLASS_INCLUDE", str(_include(tmp_path / "include", (3, 8, 0))))
    monkeypatch.setattr(builtin_support, "gemm_arch", lambda: "")
    here = "no GPU" if not torch.cuda.is_available() else "compute capability %d.%d" % torch.cuda.get_device_capability()
    assert reasons() == {f"its CUTLASS GEMM needs a GPU of compute capability 8.0 or later ({here}; CUTLASS 3.8.0 found)"}
    monkeypatch.setattr(builtin_support, "gemm_arch", lambda: "sm80")  # (an Ampere GPU: the matmul and the convolution declared)
    assert all(BuiltinSupport().supports(n) == (True, "") for n in nodes)
    monkeypatch.setenv("KEVIN_CUTLASS_INCLUDE", str(tmp_path))
    (reason,) = reasons()
    assert "there is no cutlass/cutlass.h in it" in reason
    assert all(not BuiltinSupport().supports(n)[0] for n in nodes)
