"""ATen lowerings, one module per topic; importing this package fills the registry."""
from . import creation, indexing, pointwise, reductions, views  # noqa: F401
