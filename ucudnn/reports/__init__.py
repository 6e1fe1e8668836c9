"""Reports of plans for people: tables (report), plots, and what the measurements cover.

May import: core, optimizers, execute, measure, plan (docs/architecture.md; tests/test_imports.py
checks)."""
