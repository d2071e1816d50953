"""The rows kernels' reductions across a row's threads (`kevin_row_reduce_<op>`: sum, max, min; with
index reductions, `kevin_row_reduce_arg<op>`: the first largest and smallest value with its
position), one template per way a row's threads lie (cuda/*_reduce*.cuh):

    row      a row's threads together in the block (a warp, part of one, or several warps)
    column   a row's threads one per `rows_per_block` in the block (rows across memory)
    cluster  a row over a cluster's blocks (distributed shared memory)
    spread   rows across memory, each row's columns over a cluster's blocks

    code = row_reducers(variant, indexed=True)
"""

from __future__ import annotations

from kevin_backend.generate.builtin.codegen import cuda_code
from kevin_backend.generate.builtin.variants import Variant

__all__ = ["row_reducers"]

# (op, combine of {a} and {b}, the combine's identity); maximum and minimum propagate NaN, as torch's
_OPS = (("add", "{a} + {b}", "0.0f"), ("max", "kevin_maximum({a}, {b})", "-INFINITY"), ("min", "kevin_minimum({a}, {b})", "INFINITY"))
_SHUFFLED = "__shfl_xor_sync(0xffffffffu, v, o)"


def row_reducers(variant: Variant, indexed: bool = False) -> str:
    """The device functions reducing a row across the threads of `variant`'s mapping; with
    `indexed`, the index reductions' steps and joins too."""
    threads, rpb, cluster = variant.threads, max(1, variant.rows_per_block), variant.cluster
    if cluster > 1 and variant.columns:
        code = "".join(_spread(op, combine, init, threads, rpb, cluster) for op, combine, init in _OPS)
        arg = "".join(cuda_code("spread_reduce_arg.cuh", op=op, threads=threads, rpb=rpb, cluster=cluster,
                                own=threads * rpb, gathered=(threads + 1) * rpb) for op in ("max", "min"))
    elif cluster > 1:
        warps = max(1, threads // 32)
        code = "".join(cuda_code("cluster_reduce.cuh", op=op, step=combine.format(a="v", b=_SHUFFLED), warps=warps, init=init,
                                 cluster=cluster) for op, combine, init in _OPS)
        arg = "".join(cuda_code("cluster_reduce_arg.cuh", op=op, warps=warps, cluster=cluster) for op in ("max", "min"))
    elif variant.columns:
        code = "".join(_column(op, combine, init, threads, rpb) for op, combine, init in _OPS)
        arg = "".join(cuda_code("column_reduce_arg.cuh", op=op, threads=threads, rpb=rpb) for op in ("max", "min"))
    else:
        code = "".join(_row(op, combine, init, threads) for op, combine, init in _OPS)
        arg = "".join(cuda_code("row_reduce_arg.cuh", op=op, first_offset=min(16, threads // 2), warps=max(1, threads // 32))
                      for op in ("max", "min"))
    return code + cuda_code("arg_steps.cuh") + arg if indexed else code


def _row(op: str, combine: str, init: str, threads: int) -> str:
    warps = max(1, threads // 32)
    return cuda_code("row_reduce.cuh", op=op, first_offset=min(16, threads // 2), step=combine.format(a="v", b=_SHUFFLED), warps=warps,
                     init=init, gather=combine.format(a="v", b=f"smem[row_in_block * {warps} + w]"))


def _column(op: str, combine: str, init: str, threads: int, rpb: int) -> str:
    gather = combine.format(a="v", b=f"smem[w * {rpb} + row_in_block]")
    if 1 < threads and rpb < 32 and 32 % rpb == 0 and threads * rpb % 32 == 0:  # a row's threads several to a warp
        return cuda_code("column_reduce_shuffled.cuh", op=op, rpb=rpb, step=combine.format(a="v", b=_SHUFFLED), init=init,
                         warps=threads * rpb // 32, gather=gather)
    return cuda_code("column_reduce.cuh", op=op, threads=threads, rpb=rpb, init=init, gather=gather)


def _spread(op: str, combine: str, init: str, threads: int, rpb: int, cluster: int) -> str:
    own, gathered = threads * rpb, (threads + 1) * rpb
    return cuda_code("spread_reduce.cuh", op=op, threads=threads, rpb=rpb, cluster=cluster, own=own, gathered=gathered, init=init,
                     add=combine.format(a="b", b=f"smem[w * {rpb} + row_in_block]"),
                     join=combine.format(a="v", b=f"smem[{gathered} + r * {rpb} + row_in_block]"))
