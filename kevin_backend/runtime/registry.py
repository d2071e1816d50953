"""The kernels compiled code runs: loaded from kernel cache entries, registered by digest.

    kernel = load_entry(entry, config)       # builds (under config's cache folder) and checks it
    register(kernel)                          # `kevin::launch` (op.py) finds it by digest
    lookup(digest)                            # the registry, else the caches the backend used

A `LoadedKernel` runs only on inputs exactly like those it was verified on (shapes, strides,
dtypes). Other inputs (another size under `dynamic=True`) run Inductor's code for the partition:
its reference program compiled by Inductor with symbolic sizes, once, on the first such call. A
kernel that raises is disabled and replaced the same way, with the reason logged; where Inductor
cannot compile or run the reference, the reference runs eagerly. Each output has one memory
format for every call (`LoadedKernel.output_formats`): channels-last where the reference's output
for the verified inputs lies channels-last (as eager lays out a convolution of a channels-last
input), else contiguous. The op's fake implementation and every real call (the kernel's, Inductor's
code, the reference's) give it; an output in another layout is copied into it.

The backend hands the runtime each compile's cache with the compile's `Config` (`use_cache`):
a kernel is built under that config's cache folder (its build folder and precompiled header),
and a digest that compiled code names is looked up in those caches, newest first. Only a
process that compiled nothing (no cache handed) falls back on the environment's configuration.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from kevin_backend.cache.format import CacheEntry, EntryKind
from kevin_backend.cache.kernel_store import KernelStore
from kevin_backend.config import Config, build_root
from kevin_backend.measure.compare import compare_outputs, exact_outputs
from kevin_backend.measure.inputs import clone_layout
from kevin_backend.runtime.counters import counters
from kevin_backend.toolchain.build import Builder, answering_load_inline
from kevin_backend.toolchain.static_rules import check_program, check_task_program
from kevin_backend.types import TensorSpec, channels_last_form, load_program

__all__ = ["KernelMismatch", "LoadedKernel", "RejectedProgram", "check_entry", "entry_violations", "as_output_list", "fresh_outputs", "kernel_calls", "load_entry", "loaded_kernels", "prebuild",
           "register", "lookup", "use_cache"]

log = logging.getLogger("kevin_backend")


@dataclass
class LoadedKernel:
    """A cached kernel ready to run, with the reference it falls back to."""

    digest: str
    inputs: tuple[TensorSpec, ...]
    kernel: Callable[..., Any]  # ModelNew(...).forward
    reference: Callable[..., Any]  # Model(...).forward: the partition's exact computation
    source: str = ""  # the kernel program it was built from
    disabled: str | None = None  # why the kernel is no longer used
    calls: int = field(default=0, init=False)  # times the kernel itself ran (not its reference)
    _told: bool = field(default=False, init=False, repr=False)
    # After a first call whose outputs were contiguous fresh tensors, later calls (same input
    # layouts, hence the same output layouts) return the kernel's outputs as they are.
    _plain: bool = field(default=False, init=False, repr=False)
    _single: bool = field(default=False, init=False, repr=False)
    _strides: list[tuple[int, ...]] = field(init=False, repr=False)
    # Inductor's code for the partition, for the inputs the kernel does not take: compiled on the
    # first such call (None: not yet; False: Inductor failed, the reference runs eagerly)
    _other: Any = field(default=None, init=False, repr=False)
    _expected: tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype, str], ...] = field(init=False, repr=False)
    # each output's memory format (`output_formats`; None: not yet found)
    _formats: list[torch.memory_format] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._expected = tuple((s.shape, s.stride, s.torch_dtype, s.device) for s in self.inputs)
        self._strides = [s.stride for s in self.inputs]
        # per input, for `direct`: the storage offsets (in elements) that keep it 16-byte aligned
        self._align = tuple(max(1, _ALIGNMENT // torch.empty((), dtype=s.torch_dtype).element_size()) for s in self.inputs)

    def direct(self, inputs: Sequence[Any], grad: bool) -> list[torch.Tensor] | None:
        """The kernel's outputs for a call from Inductor's code with static sizes, checked as
        cheaply as such a call allows; None when the call needs the full path (`__call__`): a
        first call, a disabled kernel, a gradient to record, an alignment the kernel was not
        verified on. What is not checked here is guaranteed by the caller: Dynamo's guards fix
        sizes and dtypes, the op's exact-strides tag makes Inductor pass the verified strides,
        and the op's `__call__` takes this path only with no dispatch or function mode active
        (so no fake or traced tensors). Storages from torch's allocator start aligned (and
        Inductor copies misaligned graph inputs), so a storage offset decides the alignment."""
        if not self._plain or self.disabled is not None:
            return None
        for t, align in zip(inputs, self._align):
            if t.storage_offset() % align or (grad and t.requires_grad):
                return None
        try:
            out = self.kernel(*inputs)
        except Exception as exc:  # noqa: BLE001 - disabled; the full path runs Inductor's code
            self._disable(exc)
            return None
        self.calls += 1
        return [out] if self._single else list(out)

    def _disable(self, exc: BaseException) -> None:
        """A kernel that raises is never tried again in this process."""
        self.disabled = f"{type(exc).__name__}: {exc}"
        counters.add("runtime_errors")
        log.warning("kevin kernel %s failed (%s); running its reference from now on", self.digest, self.disabled)

    def accepts(self, inputs: Sequence[torch.Tensor]) -> bool:
        """True when `inputs` are exactly what the kernel was verified on."""
        if len(inputs) != len(self._expected):
            return False
        for t, (shape, stride, dtype, device) in zip(inputs, self._expected):
            if t.dtype != dtype or t.shape != shape or (not t.is_cuda if device == "cuda" else t.device.type != device):
                return False
            if t.stride() != stride and not _same_layout(shape, t.stride(), stride):
                return False
        return True

    def __call__(self, inputs: Sequence[torch.Tensor], check_sizes: bool = True) -> list[torch.Tensor]:
        """Run the kernel, or the reference when the inputs are not what the kernel was verified on.

        In a graph compiled with static shapes, Dynamo's guards fix sizes and dtypes and Inductor
        fixes strides (the op's exact-strides tag), so `check_sizes=False` compares strides only.
        """
        usable = self.disabled is None and (
            (not check_sizes and [t.stride() for t in inputs] == self._strides) or self.accepts(inputs)
        ) and all(t.data_ptr() % _ALIGNMENT == 0 for t in inputs)
        if usable:
            try:
                out = self.kernel(*inputs)
            except Exception as exc:  # noqa: BLE001
                self._disable(exc)
            else:
                self.calls += 1
                if self._plain:
                    return [out] if self._single else list(out)
                return self._first_outputs(out, inputs)
        elif self.disabled is None:
            counters.add("runtime_size_fallbacks")
            if not self._told:
                self._told = True
                got = [(tuple(t.shape), t.stride(), t.dtype, t.device.type) for t in inputs]
                log.info("kevin kernel %s: inputs %s differ from the verified %s; running Inductor's code for them",
                         self.digest, got, self._expected)
        return self._conformed(_unaliased(self._otherwise(inputs), inputs), inputs)

    def _otherwise(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The partition computed by Inductor's code (compiled once, symbolic sizes), or by the
        reference eagerly where Inductor fails."""
        if self._other is None:
            self._other = torch.compile(self.reference, backend="inductor", dynamic=True)
        if self._other is not False:
            try:
                out = as_output_list(self._other(*inputs))
            except Exception as exc:  # noqa: BLE001 - Inductor's failure: the reference still answers
                self._other = False
                counters.add("runtime_inductor_errors")
                log.warning("kevin kernel %s: Inductor could not run its partition (%s: %s); its reference runs eagerly",
                            self.digest, type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
            else:
                counters.add("runtime_inductor_calls")
                return out
        return as_output_list(self.reference(*inputs))

    def _first_outputs(self, out: Any, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        raw = as_output_list(out)
        fresh = self._conformed(_unaliased(raw, inputs), inputs)
        self._single = isinstance(out, torch.Tensor)
        self._plain = all(a is b for a, b in zip(fresh, raw))
        return fresh

    def output_formats(self) -> list[torch.memory_format]:
        """Each output's memory format, the same for every call and for the op's fake
        implementation (so the code compiled around the op reads what it gets, whatever the sizes):
        channels-last (3-D) where the reference's output for inputs like the verified ones lies so
        and not plainly too, else contiguous. Found once, from a run on fake tensors; where that
        run fails, every output is contiguous."""
        if self._formats is None:
            self._formats = _reference_formats(self.reference, self.inputs, self.digest)
        return self._formats

    def output_format(self, k: int) -> torch.memory_format:
        """Output `k`'s memory format (`output_formats`; contiguous past their count)."""
        formats = self.output_formats()
        return formats[k] if k < len(formats) else torch.contiguous_format

    def _conformed(self, outputs: list[torch.Tensor], inputs: Sequence[Any]) -> list[torch.Tensor]:
        """`outputs` in their memory formats (`output_formats`): one in another layout is copied."""
        conformed = []
        for k, o in enumerate(outputs):
            form = self.output_format(k)
            conformed.append(o if o.is_contiguous(memory_format=form) else o.contiguous(memory_format=form))
        return conformed


# The judge verifies kernels on inputs that start on fresh allocations; an input that starts
# elsewhere (a view with an offset) may break a kernel's vector loads: the reference runs it.
_ALIGNMENT = 16


def _unaliased(outputs: list[torch.Tensor], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Outputs that share memory with an input or an earlier output are copied: an op's outputs
    must be fresh tensors (Inductor and autograd rely on it)."""
    seen = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    result = []
    for o in outputs:
        ptr = o.untyped_storage().data_ptr()
        if o.numel() and ptr in seen:
            o = o.clone()
            ptr = o.untyped_storage().data_ptr()
        seen.add(ptr)
        result.append(o)
    return result


def _same_layout(shape: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Strides of size-1 dimensions never address memory: only the others must agree."""
    return all(x == y for n, x, y in zip(shape, a, b) if n != 1)


def as_output_list(out: Any) -> list[torch.Tensor]:
    """A module's output as a list of tensors, each as it lies."""
    return [out] if isinstance(out, torch.Tensor) else list(out)


def _format(t: torch.Tensor) -> torch.memory_format:
    """Channels-last (3-D) where `t` lies so and not plainly too, else contiguous."""
    form = channels_last_form(t)
    return form if form is not None and not t.is_contiguous() else torch.contiguous_format


def _reference_formats(reference: Callable[..., Any], specs: Sequence[TensorSpec], digest: str) -> list[torch.memory_format]:
    """The memory formats of the reference's outputs on fake tensors laid out as `specs` (outside
    any fake mode the caller runs in: the op's fake implementation asks too); all contiguous,
    said once, where that run fails."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

    try:
        with unset_fake_temporarily(), FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
            fakes = [torch.empty_strided(s.shape, s.stride, dtype=s.torch_dtype, device=s.device) for s in specs]
            return [_format(o) for o in as_output_list(reference(*fakes))]
    except Exception as exc:  # noqa: BLE001 - every output then contiguous, in the fake and the real calls alike
        log.warning("kevin kernel %s: its reference did not run on fake tensors (%s: %s); its outputs are made contiguous",
                    digest, type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
        return []


def fresh_outputs(kernel: LoadedKernel, inputs: Sequence[Any]) -> list[torch.Tensor]:
    """The op's outputs for `inputs` (fake tensors) as its fake implementation gives them: the
    reference's, each in its memory format (`LoadedKernel.output_formats`), one that aliases an
    input or an earlier output cloned, as the real op copies it."""
    fresh: list[torch.Tensor] = []
    for k, o in enumerate(as_output_list(kernel.reference(*inputs))):
        o = o.contiguous(memory_format=kernel.output_format(k))
        if any(torch._C._is_alias_of(o, t) for t in (*inputs, *fresh) if isinstance(t, torch.Tensor)):
            o = o.clone()
        fresh.append(o)
    return fresh


_lock = threading.Lock()
# digest -> kernel; read without the lock on every launch (a dict's reads are atomic)
loaded_kernels: dict[str, LoadedKernel] = {}


@dataclass(frozen=True)
class _Source:
    """A cache the backend used, with the config of the compile that used it."""

    cache: KernelStore
    config: Config


_sources: list[_Source] = []  # newest first, one per cache folder


def use_cache(cache: KernelStore, config: Config) -> None:
    """Let the runtime load kernels from `cache`, building them under `config`'s cache folder
    (called by the backend on every compile, with the compile's config)."""
    with _lock:
        for i, known in enumerate(_sources):
            if known.cache.cache_dir == cache.cache_dir:
                _sources.pop(i)
                break
        _sources.insert(0, _Source(cache, config))


def load_entry(entry: CacheEntry, config: Config) -> LoadedKernel:
    """Build a runnable kernel from a KERNEL cache entry (executes its program: may compile CUDA,
    under `config`'s cache folder). The kernel program and the task program pass the static rules
    first (RejectedProgram otherwise, and neither is executed); of the kernel program only
    `ModelNew` is taken.

    A kernel already loaded in this process from the same program is reused: a model whose
    layers repeat one partition loads its kernel once.
    """
    if entry.kind is not EntryKind.KERNEL or entry.kernel_source is None:
        raise ValueError(f"entry {entry.digest} holds no kernel")
    known = loaded_kernels.get(entry.digest)
    if known is not None and known.source == entry.kernel_source and known.disabled is None:
        return known
    # a cache (a seed cache, an imported archive) is code from elsewhere: nothing of it runs
    # unless it passes the rules a candidate passes
    check_entry(entry)
    task_module, init_inputs, device = _load_task(entry)
    # The kernel's load_inline goes through the judge's builder: its fast path, and a build
    # shared with the judge's when it built the same source.
    with answering_load_inline(_builder(config), _arch(device)):
        kernel_module = load_program(entry.kernel_source, f"kevin_kernel_{entry.digest}")
        if not hasattr(kernel_module, "ModelNew"):
            raise ValueError(f"kernel of entry {entry.digest} defines no ModelNew")
        model = kernel_module.ModelNew(*init_inputs).to(device).eval()
    reference = task_module.Model(*init_inputs).to(device).eval()
    kernel = LoadedKernel(entry.digest, entry.key.inputs, model.forward, reference.forward, entry.kernel_source)
    _smoke_test(kernel, task_module, reference)
    return kernel


def _load_task(entry: CacheEntry) -> tuple[Any, list[Any], str]:
    """The entry's task program as a module (checked by the caller), its init inputs, its device."""
    task_module = load_program(entry.task.source, f"kevin_task_{entry.digest}")
    # importable by its name: Dynamo looks a module up there when it compiles the reference's
    # forward for the sizes the kernel does not take (`LoadedKernel._otherwise`)
    sys.modules.setdefault(task_module.__name__, task_module)
    device = entry.task.inputs[0].device if entry.task.inputs else "cpu"
    return task_module, list(task_module.get_init_inputs()), device


def _refused_kernel(entry: CacheEntry, reason: str) -> LoadedKernel:
    """For compiled code that names a kernel whose program the rules refuse (a warm Inductor
    cache, a cache changed since): the partition's reference alone, through Inductor's code, the
    kernel program never executed. A task program the rules refuse is not run either."""
    if check_task_program(entry.task.source):
        raise RejectedProgram(reason)
    task_module, init_inputs, device = _load_task(entry)
    reference = task_module.Model(*init_inputs).to(device).eval()

    def refused(*_: Any) -> Any:
        raise RejectedProgram(reason)

    return LoadedKernel(entry.digest, entry.key.inputs, refused, reference.forward, entry.kernel_source or "",
                        disabled=reason)


class RejectedProgram(ValueError):
    """A cached entry's kernel or task program breaks the static rules: it is never executed."""


def entry_violations(entry: CacheEntry) -> list[str]:
    """The static rules a KERNEL entry's programs break: its kernel program, the rules a
    candidate passes; its task program, the rules for tasks. Empty for any other entry (nothing
    of it is executed)."""
    if entry.kind is not EntryKind.KERNEL:
        return []
    broken = [f"kernel program: {v}" for v in check_program(entry.kernel_source or "")]
    return broken + [f"task program: {v}" for v in check_task_program(entry.task.source)]


def check_entry(entry: CacheEntry) -> None:
    """Raise RejectedProgram, naming the entry and the rules, when `entry_violations` finds any."""
    broken = entry_violations(entry)
    if broken:
        log.warning("kevin: cached entry %s breaks the static rules and is not loaded: %s", entry.digest, "; ".join(broken))
        raise RejectedProgram(f"entry {entry.digest} breaks the static rules: " + "; ".join(broken[:3]))


def prebuild(entries: Sequence[CacheEntry], config: Config) -> int:
    """Build the kernels of several entries at once (under `config`'s cache folder), before they
    are loaded one by one: a compile that hits many kernels a fresh machine has not built yet (a
    seed cache) waits for the slowest build instead of their sum. Failures are left for
    `load_entry` to report. Returns the number of builds started."""
    from kevin_backend.toolchain.build import BuildSpec
    from kevin_backend.toolchain.candidate import Candidate

    specs = []
    for entry in entries:
        known = loaded_kernels.get(entry.digest)
        if entry.kind is not EntryKind.KERNEL or not entry.kernel_source or (known is not None and known.source == entry.kernel_source):
            continue
        device = entry.task.inputs[0].device if entry.task.inputs else "cpu"
        try:
            check_entry(entry)  # nothing is built of a program the rules refuse
            specs += [BuildSpec.of(ext, _arch(device)) for ext in Candidate.parse(entry.kernel_source).extensions]
        except Exception:  # noqa: BLE001 - load_entry reports what is wrong with the entry
            continue
    unique = list({spec.digest: spec for spec in specs}.values())
    if len(unique) > 1:
        _builder(config).build_many(unique)
    return len(unique)


def _builder(config: Config) -> Builder:
    """The builder of `config`'s kernel cache: the judges' build folder and precompiled header."""
    return Builder(build_root(config.cache_dir), pch_root=config.cache_dir)


def _arch(device: str) -> str | None:
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return f"{major}.{minor}"


class KernelMismatch(RuntimeError):
    """A cached kernel disagrees with its task's reference on a smoke run."""


def _smoke_test(kernel: LoadedKernel, task_module: Any, reference: torch.nn.Module) -> None:
    """One run of the kernel and its reference on the task's own inputs before the kernel is used:
    a damaged or mismatched cache entry is caught here, never in a user's forward pass. (The
    judge verified the kernel thoroughly; this only guards the way from the cache to the graph.)
    The kernel gets its own copies with the inputs' exact layouts (a broadcast stays stride 0, a
    transpose stays transposed), so a kernel that ignores strides is caught here too.

    Compared with eager first (KernelBench's tolerances); an output past them is compared again as
    the judge compares, with the exact run (`exact_outputs`): a kernel more exact than eager, where
    eager rounds between its ops (a bfloat16 convolution kept in float32 through its batch norm),
    lies past eager's tolerances at a few elements (on an H100: 289 of 2.1M, by up to 0.5)."""
    with torch.no_grad():
        inputs = list(task_module.get_inputs())
        got = as_output_list(kernel.kernel(*[clone_layout(t) if isinstance(t, torch.Tensor) else t for t in inputs]))
        want = as_output_list(kernel.reference(*inputs))
    from kevin_backend.measure.precision import task_precision

    precision = task_precision(task_module, inputs)  # (the rounding the task leaves in each output)
    bad = compare_outputs(got, want, None, precision=precision)
    if bad is not None and bad.total_elements:
        device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
        exact = exact_outputs(reference, inputs, want, device)
        if exact is not None:
            bad = compare_outputs(got, want, exact, precision=precision)
    if bad is None:
        return
    if not bad.total_elements:
        raise KernelMismatch(bad.message)
    raise KernelMismatch(f"output {bad.output}: {bad.bad_elements} of {bad.total_elements} elements differ from the task "
                         f"(max abs error {bad.max_abs_error:.3g})")


def register(kernel: LoadedKernel) -> None:
    with _lock:
        loaded_kernels[kernel.digest] = kernel


def lookup(digest: str) -> LoadedKernel:
    """The kernel for `digest`: from the registry, else loaded from a cache the backend used."""
    kernel = loaded_kernels.get(digest)
    if kernel is not None:
        return kernel
    with _lock:
        sources = list(_sources)
    if not sources:
        # A process that compiled nothing (no cache handed) has only the environment to go by.
        from kevin_backend.cache.store import KernelCache

        config = Config.from_env()
        sources = [_Source(KernelCache.from_config(config), config)]
    for source in sources:
        entry = source.cache.get_digest(digest)
        if entry is not None and entry.kind is EntryKind.KERNEL:
            try:
                kernel = load_entry(entry, source.config)
            except RejectedProgram as exc:
                kernel = _refused_kernel(entry, str(exc))
            counters.add("runtime_loads")
            register(kernel)
            return kernel
    raise RuntimeError(
        f"kevin kernel {digest} is in compiled code but in no kernel cache "
        f"(searched: {[str(s.cache.cache_dir) for s in sources]}). "
        "Restore the cache entry, or clear Inductor's cache so the model is compiled again."
    )


def kernel_calls() -> dict[str, int]:
    """How many times each loaded kernel itself ran in this process (its reference's runs are
    not counted): what shows that a compiled model ran kevin kernels, not their fallbacks."""
    return {digest: kernel.calls for digest, kernel in list(loaded_kernels.items())}
