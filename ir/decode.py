"""The calling convention of a causal LM's decode graph, which frontend/hf.py builds and the
reference interpreter, the runtime and the benches call: ids [1, T], pos [] int64, window [W],
then the KV caches. Attention reads the caches' first W positions; W is a symbol, bound by the
window's length alone (its values are never read), so that a step's cost follows the context."""
from __future__ import annotations

import numpy as np

from .errors import ShapeError
from .graph import Graph

WINDOW = "window"     # the window's symbol, and the input's name
SHORTEST = 2          # torch.export specializes a length of 1; the mask hides a slot past the token
CACHES_START = 3      # where the caches start among the inputs


def window_length(pos: int, tokens: int = 1) -> int:
    """The window for tokens at pos .. pos+tokens-1: every position they see."""
    return max(pos + tokens, SHORTEST)


def window(graph: Graph, pos: int, tokens: int = 1) -> np.ndarray:
    """The window input of `graph` for tokens at pos .. pos+tokens-1."""
    length, longest = window_length(pos, tokens), graph.symbols[WINDOW][1]
    if length > longest:
        raise ShapeError(f"kiln: position {pos + tokens - 1} is past the KV cache of {longest} positions")
    return np.zeros(length, dtype=np.bool_)


def decode_args(graph: Graph, ids: np.ndarray, pos: int, caches: list) -> list:
    """The decode graph's inputs, in order, for the token(s) `ids` [1, T] at position `pos`."""
    return [ids, np.array(pos, dtype=np.int64), window(graph, pos, np.shape(ids)[1]), *caches]
