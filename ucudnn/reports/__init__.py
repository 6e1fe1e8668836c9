"""Reports of plans for people: tables (report), plots, what the measurements cover (coverage),
a Planner's summary (summary), and where a converted model's time goes, kernel by kernel (kernels).

May import: core, optimizers, execute, measure, plan (docs/architecture.md; tests/test_imports.py
checks)."""
