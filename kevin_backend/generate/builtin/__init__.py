"""The built-in kernel writer: CUDA C++ for pointwise chains and last-dimension reductions,
generated straight from a task's aten graph (no model involved)."""
