"""Running a kept kernel: the op `kevin::launch`, loading and smoke-checking a built kernel, and
the process-wide counters. Imports the toolchain, measurement and the cache below it."""
