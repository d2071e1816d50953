"""The built-in kernel writer: CUDA C++ for pointwise chains and reductions over any dimensions
(with index reductions and norms built on them), generated straight from a task's aten graph
(no model involved)."""
