"""Typed errors: the CLI turns each into one clear line and a non-zero exit."""


class KilnError(Exception):
    """Base of every error Kiln raises on purpose."""


class ShapeError(KilnError, ValueError):
    """Shapes that do not fit an op, or inputs whose shape differs from what the graph expects."""


class KilnTypeError(KilnError, TypeError):
    """Dtypes that do not fit an op, or inputs of the wrong dtype or count."""


class UnsupportedOp(KilnError):
    """An ATen op with no lowering."""


class ExportError(KilnError):
    """torch.export rejected the module."""


class CompileError(KilnError):
    """A generated kernel the backend's compiler rejected (a candidate's failure, not the
    machine's)."""
