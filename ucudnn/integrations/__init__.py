"""Framework integrations (PyTorch)."""
