"""fl_lightning: federated learning for language-driven heterogeneous FL, on PyTorch
Lightning (client objectives) and Ray (client actors)."""

__version__ = "0.1.0"
