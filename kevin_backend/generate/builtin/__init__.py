"""The built-in kernel writer: CUDA C++ for pointwise chains and reductions over any dimensions
(with index reductions and norms built on them), generated straight from a task's aten graph
(no model involved).

    plan = planner.plan_task(source)                              # a Plan, or Declined(reason)
    name = variant_ranking.preferred_order(plan)[0]              # the shape's best bet
    program = program.write_program(plan, variants.variant_named(plan, name))

Reading the task: planner.py (plan_task), tracing.py, graph_nodes.py, plan_builder.py,
plan_handlers.py, cross_entropy.py, ops.py (the pointwise op table), plan.py (the plan types);
builtin_support.py declares the writer's ops to the partitioner.

Writing the program: program.py over the kernel families (pointwise_kernel.py, tiled_kernel.py,
rows_kernel.py with rows_mappings.py and row_reducers.py, split_rows.py, final_reduction.py) and
host_function.py, on a shared base (codegen.py, index_math.py, rounding.py) and the fixed device
code in cuda/*.cuh; variants.py names the tuning knobs' settings, variant_fit.py says what a plan
allows each, variant_ranking.py orders them, gpu_properties.py reads the GPU.

The writer as a policy: builtin_policy.py. Its task suites: suite.py, roofline_suite.py.
"""
