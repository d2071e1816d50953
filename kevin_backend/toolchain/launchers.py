"""The functions the split generates in the device part: a launcher per launched kernel, an
address function per kernel whose address host code takes, and the instantiations of the
templated ones for the template arguments host code uses.

    void kevin_launch_k(dim3 kevin_grid, dim3 kevin_block, size_t kevin_smem, cudaStream_t kevin_stream,
                        const float* kevin_arg0, float* kevin_arg1) { k<<<...>>>(kevin_arg0, kevin_arg1); }
    const void* kevin_kernel_k() { return (const void*)k; }

A launcher template with one type parameter, launched with a concrete type, is instantiated
explicitly (`template void kevin_launch_k<float>(...);`); any other instantiation takes the
launcher's address in a generated function (`kevin_instances_N`) that first declares what the
template arguments name (`template_arguments.Alternative`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kevin_backend.toolchain.cpp_text import in_namespaces, strip_cpp
from kevin_backend.toolchain.host_rewrite import HostUses, Site
from kevin_backend.toolchain.item_kinds import SplitState, check_device_torch
from kevin_backend.toolchain.kernel_declarations import Kernel, typed_params
from kevin_backend.toolchain.split_errors import SplitError
from kevin_backend.toolchain.template_arguments import CONCRETE_TYPES, Alternative, resolve_template_arguments

__all__ = ["GENERATED_DEVICE", "GENERATED_HOST", "Instances", "generated_function", "generated_functions", "instantiate_launchers"]

# Where generated code stands, so compiler errors in it are never read as the candidate's.
GENERATED_DEVICE = '#line 1 "kevin_launchers.cu"\n'
GENERATED_HOST = '#line 1 "kevin_host_declarations.cpp"\n'


@dataclass(frozen=True)
class Instances:
    """The device part's instantiations of launcher and address templates."""

    explicit: tuple[str, ...]  # `template void kevin_launch_k<float>(...);`, in their namespaces
    sinks: tuple[str, ...]  # functions taking the address of an instantiation (`kevin_instances_N`)


def instantiate_launchers(state: SplitState, kinds: list[str], sites: tuple[Site, ...], needs: set[str]) -> Instances:
    """The instantiations every templated site needs, for the template arguments read from the
    source; adds to `needs` the light torch types they use."""
    explicit: list[str] = []
    sinks: list[str] = []
    concrete_types: set[str] = set()
    done: set[tuple[str, str, tuple[str, ...]]] = set()
    for site in sites:
        alternatives = resolve_template_arguments(state, kinds, site.item, site.pos, site.args, 0, f"the {'launch' if site.what == 'launch' else 'address'} of kernel {site.kernel.name}")
        if len(alternatives) > 64:
            raise SplitError(f"the launch of {site.kernel.name} needs more than 64 instantiations")
        for alt in alternatives:
            single_type = _concrete_type(site, alt)
            if single_type is not None:
                key = (site.what + site.kernel.name, single_type, site.kernel.ns)
                if key not in done:
                    done.add(key)
                    concrete_types.add(single_type)
                    explicit.append(in_namespaces(site.kernel.ns, _instantiation(site.kernel, single_type, site.what)))
                continue
            for line in alt.lines:
                concrete_types.update(t for t in CONCRETE_TYPES.values() if t in line)
                check_device_torch(strip_cpp(line), needs, f"a template argument of the launch of {site.kernel.name}")
            target = f"{site.qual}kevin_{site.what}_{site.kernel.name}<{site.args}>"
            body = "\n".join([*alt.lines, f"    {{ auto* volatile kevin_p = &{target}; (void)kevin_p; }}", *(["    }"] * alt.scopes)])
            sinks.append(in_namespaces(state.items[site.item].ns, f"void kevin_instances_{len(sinks)}() {{\n{body}\n}}"))

    # Light torch things the instantiations use.
    if "c10::Half" in concrete_types:
        needs.add("half")
    if "c10::BFloat16" in concrete_types:
        needs.add("bf16")
    return Instances(tuple(explicit), tuple(sinks))


def generated_functions(state: SplitState, uses: HostUses) -> list[str]:
    """The launchers and address functions host code calls, each once, after a `#line` directive
    that places them outside the candidate's source."""
    generated = [GENERATED_DEVICE.rstrip("\n")]
    seen: set[str] = set()
    for what, table in (("launch", uses.launched), ("kernel", uses.accessed)):
        for name in table:
            for kernel in state.kernels[name]:
                text = in_namespaces(kernel.ns, generated_function(kernel, what))
                if text not in seen:
                    seen.add(text)
                    generated.append(text)
    return generated


def generated_function(kernel: Kernel, what: str) -> str:
    """The launcher (`what` "launch") or address function ("kernel") of a kernel."""
    template = f"template <{kernel.template}>\n" if kernel.template is not None else ""
    name = kernel.name + (f"<{', '.join(p.name for p in kernel.tparams)}>" if kernel.template is not None else "")
    if what == "kernel":
        return f"{template}const void* kevin_kernel_{kernel.name}() {{\n    return (const void*){name};\n}}\n"
    names = [f"kevin_arg{i}" for i in range(len(kernel.params))]
    head = ", ".join(["dim3 kevin_grid", "dim3 kevin_block", "size_t kevin_smem", "cudaStream_t kevin_stream", *typed_params(kernel.name, kernel.params)])
    return (
        f"{template}void kevin_launch_{kernel.name}({head}) {{\n"
        f"    {name}<<<kevin_grid, kevin_block, kevin_smem, kevin_stream>>>({', '.join(names)});\n"
        "}\n"
    )


def _concrete_type(site: Site, alt: Alternative) -> str | None:
    """The one concrete type a single-type-parameter kernel is launched with here, when that is all
    the instantiation needs (then it is instantiated explicitly), else None."""
    kernel = site.kernel
    if len(kernel.tparams) != 1 or kernel.tparams[0].kind != "type" or site.what != "launch":
        return None
    arg = re.sub(r"\s+", "", site.args)
    if arg in CONCRETE_TYPES and not alt.lines:
        return CONCRETE_TYPES[arg]
    if alt.simple and alt.bound.get(arg):
        return alt.bound[arg]
    return None


def _instantiation(kernel: Kernel, type_name: str, what: str) -> str:
    """`template void kevin_launch_k<float>(...);`: the launcher for one type, compiled here so the
    host code's call links."""
    tparam = kernel.tparams[0].name
    typed = [re.sub(rf"\b{re.escape(tparam)}\b", type_name, p) for p in typed_params(kernel.name, kernel.params, names=False)]
    head = ", ".join(["dim3", "dim3", "size_t", "cudaStream_t", *typed])
    return f"template void kevin_launch_{kernel.name}<{type_name}>({head});"
