"""Planning: the settings of a run (config), where measurements come from (sources), a set of
kernels solved into assignments (solve, assignment), and a framework's layers planned at run time:
the Planner (planner) over what it works with (framework: the Framework and Engine protocols), its
collaborators (kernels, delegation, pending, flushes), limits from the memory timeline (memory)
and what a layer's observed calls saw (moments).

May import: core, optimizers, execute, measure (docs/architecture.md; tests/test_imports.py checks)."""
