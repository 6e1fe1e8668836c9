"""Planning: the settings of a run (config), where measurements come from (sources), a set of
kernels solved into assignments (solve, assignment), and a framework's layers planned at run time:
delegation, limits from the memory timeline (memory), what a layer's observed calls saw
(moments), the Planner.

May import: core, optimizers, execute, measure (docs/architecture.md; tests/test_imports.py checks)."""
