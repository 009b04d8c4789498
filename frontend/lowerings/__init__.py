"""ATen lowerings, one module per topic; importing this package fills the registry."""
from . import (complex_pairs, creation, indexing, normalization, pointwise, reductions, scatter,  # noqa: F401
               spatial, views)
