"""PyTorch models to Kiln IR: torch.export, core ATen decompositions, one lowering per op."""
from .lower import export, interpret, lower, lower_exported

__all__ = ["export", "interpret", "lower", "lower_exported"]
