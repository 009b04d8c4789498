"""ATen lowerings, one module per topic; importing this package fills the registry."""
from . import creation, indexing, normalization, pointwise, reductions, scatter, spatial, views  # noqa: F401
