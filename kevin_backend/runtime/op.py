"""Runtime: the custom op `kevin::launch` that runs a cached kernel in place of its partition.

    torch.ops.kevin.launch(key: str, inputs: list[Tensor], check_sizes: bool) -> list[Tensor]

The op is defined when this module is imported (the package imports it), so Inductor code cached
on disk and loaded by a fresh process finds it. `key` is the cache key's digest; the kernel is
looked up in this process's registry and, on a miss, loaded from the kernel caches the backend
has used (or the default one). Its fake implementation runs the task's reference program on fake
tensors, so output shapes follow symbolic sizes too.

Each kernel runs only on inputs exactly like those it was verified on (shapes, strides, dtypes).
Other inputs (another size under `dynamic=True`) run Inductor's code for the partition: its
reference program compiled by Inductor with symbolic sizes, once, on the first such call. A kernel
that raises is disabled and replaced the same way, with the reason logged; where Inductor cannot
compile or run the reference, the reference runs eagerly. Outputs are always contiguous, in the
fake and the real implementation alike.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from kevin_backend.runtime.counters import counters
from kevin_backend.cache.format import CacheEntry, EntryKind
from kevin_backend.toolchain.build import Builder, answering_load_inline
from kevin_backend.measure.compare import compare_outputs
from kevin_backend.measure.inputs import clone_layout
from kevin_backend.types import TensorSpec, load_program

__all__ = ["KernelMismatch", "LoadedKernel", "kernel_calls", "load_entry", "prebuild", "register", "lookup", "use_cache", "launch"]

log = logging.getLogger("kevin_backend")

_LIB = torch.library.Library("kevin", "DEF")
_TAGS = tuple(t for t in (getattr(torch.Tag, "needs_exact_strides", None),) if t is not None)
_LIB.define("launch(str key, Tensor[] inputs, bool check_sizes) -> Tensor[]", tags=_TAGS)


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
        return _unaliased(self._otherwise(inputs), inputs)

    def _otherwise(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The partition computed by Inductor's code (compiled once, symbolic sizes), or by the
        reference eagerly where Inductor fails."""
        if self._other is None:
            self._other = torch.compile(self.reference, backend="inductor", dynamic=True)
        if self._other is not False:
            try:
                out = _as_output_list(self._other(*inputs))
            except Exception as exc:  # noqa: BLE001 - Inductor's failure: the reference still answers
                self._other = False
                counters.add("runtime_inductor_errors")
                log.warning("kevin kernel %s: Inductor could not run its partition (%s: %s); its reference runs eagerly",
                            self.digest, type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
            else:
                counters.add("runtime_inductor_calls")
                return out
        return _as_output_list(self.reference(*inputs))

    def _first_outputs(self, out: Any, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        outputs = _as_output_list(out)
        fresh = _unaliased(outputs, inputs)
        raw = [out] if isinstance(out, torch.Tensor) else list(out)
        self._single = isinstance(out, torch.Tensor)
        self._plain = all(a is b for a, b in zip(fresh, raw))
        return fresh


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


def _as_output_list(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out.contiguous()]
    return [o.contiguous() for o in out]


_lock = threading.Lock()
_registry: dict[str, LoadedKernel] = {}
_caches: list[Any] = []  # KernelCache objects the backend used in this process, newest first


def use_cache(cache: Any) -> None:
    """Let the runtime load kernels from `cache` (called by the backend on every compile)."""
    with _lock:
        for i, known in enumerate(_caches):
            if getattr(known, "cache_dir", None) == getattr(cache, "cache_dir", object()):
                _caches.pop(i)
                break
        _caches.insert(0, cache)


def load_entry(entry: CacheEntry) -> LoadedKernel:
    """Build a runnable kernel from a KERNEL cache entry (executes its program: may compile CUDA).

    A kernel already loaded in this process from the same program is reused: a model whose
    layers repeat one partition loads its kernel once.
    """
    if entry.kind is not EntryKind.KERNEL or entry.kernel_source is None:
        raise ValueError(f"entry {entry.digest} holds no kernel")
    known = _registry.get(entry.digest)
    if known is not None and known.source == entry.kernel_source and known.disabled is None:
        return known
    task_module = load_program(entry.task.source, f"kevin_task_{entry.digest}")
    # importable by its name: Dynamo looks a module up there when it compiles the reference's
    # forward for the sizes the kernel does not take (`LoadedKernel._otherwise`)
    sys.modules.setdefault(task_module.__name__, task_module)
    init_inputs = list(task_module.get_init_inputs())
    device = entry.task.inputs[0].device if entry.task.inputs else "cpu"
    # The kernel's load_inline goes through the judge's builder: its fast path, and a build
    # shared with the judge's when it built the same source.
    with answering_load_inline(_builder(), _arch(device)):
        kernel_module = load_program(entry.kernel_source, f"kevin_kernel_{entry.digest}")
        if not hasattr(kernel_module, "ModelNew"):
            raise ValueError(f"kernel of entry {entry.digest} defines no ModelNew")
        model = kernel_module.ModelNew(*init_inputs).to(device).eval()
    reference = task_module.Model(*init_inputs).to(device).eval()
    kernel = LoadedKernel(entry.digest, entry.key.inputs, model.forward, reference.forward, entry.kernel_source)
    _smoke_test(kernel, task_module)
    return kernel


def prebuild(entries: Sequence[CacheEntry]) -> int:
    """Build the kernels of several entries at once, before they are loaded one by one: a compile
    that hits many kernels a fresh machine has not built yet (a seed cache) waits for the
    slowest build instead of their sum. Failures are left for `load_entry` to report. Returns
    the number of builds started."""
    from kevin_backend.toolchain.build import BuildSpec
    from kevin_backend.toolchain.candidate import Candidate

    specs = []
    for entry in entries:
        known = _registry.get(entry.digest)
        if entry.kind is not EntryKind.KERNEL or not entry.kernel_source or (known is not None and known.source == entry.kernel_source):
            continue
        device = entry.task.inputs[0].device if entry.task.inputs else "cpu"
        try:
            specs += [BuildSpec.of(ext, _arch(device)) for ext in Candidate.parse(entry.kernel_source).extensions]
        except Exception:  # noqa: BLE001 - load_entry reports what is wrong with the entry
            continue
    unique = list({spec.digest: spec for spec in specs}.values())
    if len(unique) > 1:
        _builder().build_many(unique)
    return len(unique)


def _builder() -> Builder:
    from kevin_backend.config import Config, build_root

    return Builder(build_root(Config.from_env().cache_dir))


def _arch(device: str) -> str | None:
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return f"{major}.{minor}"


class KernelMismatch(RuntimeError):
    """A cached kernel disagrees with its task's reference on a smoke run."""



def _smoke_test(kernel: LoadedKernel, task_module: Any) -> None:
    """One run of the kernel and its reference on the task's own inputs before the kernel is used:
    a damaged or mismatched cache entry is caught here, never in a user's forward pass. (The
    judge verified the kernel thoroughly; this only guards the way from the cache to the graph.)
    The kernel gets its own copies with the inputs' exact layouts (a broadcast stays stride 0, a
    transpose stays transposed), so a kernel that ignores strides is caught here too."""
    with torch.no_grad():
        inputs = list(task_module.get_inputs())
        got = _as_output_list(kernel.kernel(*[clone_layout(t) if isinstance(t, torch.Tensor) else t for t in inputs]))
        want = _as_output_list(kernel.reference(*inputs))
    bad = compare_outputs(got, want, None)
    if bad is None:
        return
    if not bad.total_elements:
        raise KernelMismatch(bad.message)
    raise KernelMismatch(f"output {bad.output}: {bad.bad_elements} of {bad.total_elements} elements differ from the task "
                         f"(max abs error {bad.max_abs_error:.3g})")


def register(kernel: LoadedKernel) -> None:
    with _lock:
        _registry[kernel.digest] = kernel


def lookup(digest: str) -> LoadedKernel:
    """The kernel for `digest`: from the registry, else loaded from a cache the backend used."""
    kernel = _registry.get(digest)
    if kernel is not None:
        return kernel
    with _lock:
        caches = list(_caches)
    if not caches:
        from kevin_backend.cache.store import KernelCache
        from kevin_backend.config import Config

        caches = [KernelCache.from_config(Config.from_env())]
    for cache in caches:
        entry = cache.get_digest(digest)
        if entry is not None and entry.kind is EntryKind.KERNEL:
            kernel = load_entry(entry)
            counters.add("runtime_loads")
            register(kernel)
            return kernel
    raise RuntimeError(
        f"kevin kernel {digest} is in compiled code but in no kernel cache "
        f"(searched: {[str(getattr(c, 'cache_dir', c)) for c in caches]}). "
        "Restore the cache entry, or clear Inductor's cache so the model is compiled again."
    )


def kernel_calls() -> dict[str, int]:
    """How many times each loaded kernel itself ran in this process (its reference's runs are
    not counted): what shows that a compiled model ran kevin kernels, not their fallbacks."""
    return {digest: kernel.calls for digest, kernel in list(_registry.items())}


def launch(key: str, inputs: list[torch.Tensor], check_sizes: bool = True) -> list[torch.Tensor]:
    kernel = _registry.get(key)
    return (kernel or lookup(key))(inputs, check_sizes)


def _launch_fake(key: str, inputs: list[torch.Tensor], check_sizes: bool = True) -> list[torch.Tensor]:
    outputs = _as_output_list(lookup(key).reference(*inputs))
    fresh: list[torch.Tensor] = []
    for o in outputs:
        if any(torch._C._is_alias_of(o, t) for t in (*inputs, *fresh)):
            o = o.clone()
        fresh.append(o)
    return fresh


_LIB.impl("launch", launch, "CompositeExplicitAutograd")
torch.library.register_fake("kevin::launch", _launch_fake, lib=_LIB)

_PLAIN = (torch.Tensor, torch.nn.Parameter)
# looked up once: they run on every call
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._len_torch_function_stack
_functorch_transforms = torch._C._are_functorch_transforms_active
_grad_enabled = torch._C.is_grad_enabled


class _DirectLaunch(torch._ops.OpOverload):
    """`torch.ops.kevin.launch.default`, as Inductor's code calls it: straight to `launch` when
    nothing could intercept the call on its way through the dispatcher (no dispatch or function
    mode such as fake tensors or tracing, no functorch transform, only plain tensors, no gradient
    to record). That saves the dispatcher's round trip into Python, a few microseconds a call;
    every other call goes through the dispatcher as any op's does."""

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != 3 or _dispatch_modes() or _function_modes() or _functorch_transforms():
            return self._op(*args, **kwargs)
        key, inputs, check_sizes = args
        grad = _grad_enabled()
        kernel = _registry.get(key)
        # symbolic sizes (check_sizes): the inputs compared with the verified ones first
        if kernel is not None and len(inputs) == len(kernel._align) and (not check_sizes or kernel.accepts(inputs)):
            out = kernel.direct(inputs, grad)
            if out is not None:
                return out
        for t in inputs:
            if type(t) not in _PLAIN or (grad and t.requires_grad):
                return self._op(*args)
        return launch(key, inputs, check_sizes)


torch.ops.kevin.launch.default.__class__ = _DirectLaunch
