"""The fusion policies: how much a schedule recomputes instead of storing, and which reductions it
runs inside the kernels that read them. The search chooses among POLICIES by measuring."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FusionPolicy:
    """How much elementwise work may be recomputed instead of stored: `inline_limit` ops for a
    value several kernels read, `broadcast_limit` for one read under a broadcast (recomputed for
    every broadcast element, e.g. an activation feeding a matrix product). `epilogues`: a
    reduction whose only reader is an elementwise chain ending in a kernel of the same points runs
    inside that kernel (a GEMV and its cast, residual add or KV-cache write as one kernel), at the
    price of the library call: a product with an epilogue is a generated kernel. `merges`: a
    reduction runs inside every kernel that reads it wherever each needs it once per point, not
    once per step of its own loop (the norm's sum of squares inside the GEMVs that read the
    normalized row, softmax's max and sum inside the P.V product, gate and up in the kernel of
    their product), and kernels of equal points that need nothing of each other launch as one (the
    K and V cache writes): fewer kernels, for work repeated at every point of the reader. `rows`:
    a reduction runs inside the kernels that read it wherever each reads it once per row (all its
    output loops but the last), as does a per-row value it feeds (the norm's reciprocal): a
    backend runs such a kernel a row at a time, the row's reductions once (softmax's any, max and
    sum, then its probabilities; a norm's sum of squares, then its normalized row), and the
    kernels of the products around it stay plain (library calls); and a value read only through a
    permutation is stored permuted; with `merges` too, a reduction merges into no kernel that
    reduces over a length known only at run time (P.V over decode's window) unless the merged
    kernel keeps one reduction: softmax's max and sum merge into its probabilities, a row kernel,
    and P.V stays one loop that a backend can split among blocks over a long context
    (flash-decoding's split; the merged form reads a 3,900-long window at 88 GB/s on the H200).
    `attention`: a product whose operand is a row kernel (softmax)
    takes in that kernel and every wide (f32) kernel behind it up to 16-bit values (the scores,
    the scaled query and keys), where the result is fused attention (codegen/attention.py): one
    pass over the keys, no scores stored; in decode, one query a head, its keys split among
    blocks on the GPU (codegen/cuda_decode_attention.py). An f32 model's decode attention stops
    instead at the scores' operands and the caches' updates; with `merges`, the query's projection
    then merges into the kernel its rotary became. `rereads` (with `merges`): a merge may
    compute at a point a product that another point computes too (the rotary's partner row: the
    query projection inside its rotary reads every weight row twice, once for each point of a
    pair), one kernel fewer for twice the weight's bytes; without it that product is stored.
    `heads` (the CPU's; with `merges` and `rows`): the output projection split by head
    (codegen/heads.py), each head's partial takes in every kernel behind it up to the caches'
    updates (the query's projection and rotary, the scores, softmax, P.V), and the partials' sum
    runs in the kernels reading it: a decode layer's attention is one kernel of a head an
    iteration, its rows (the query, the head's output) staged per head. A GPU would run it on
    as many blocks as heads, too few."""
    inline_limit: int = 12
    broadcast_limit: int = 1
    epilogues: bool = False
    merges: bool = False
    rows: bool = False
    attention: bool = False
    rereads: bool = True
    heads: bool = False

    @property
    def backends(self) -> tuple[str, ...]:
        return ("cpu",) if self.heads else ("cpu", "cuda")

    def key(self) -> str:
        return (f"inline{self.inline_limit}-bcast{self.broadcast_limit}"
                + ("-epilogue" if self.epilogues else "") + ("-merge" if self.merges else "")
                + ("-rows" if self.rows else "") + ("-attention" if self.attention else "")
                + ("" if self.rereads else "-once") + ("-heads" if self.heads else ""))


# the fusion policies the search chooses among, by name (a tuner "variant")
POLICIES = {p.key(): p for p in (FusionPolicy(12, 1), FusionPolicy(12, 1, epilogues=True),
                                  FusionPolicy(4, 0), FusionPolicy(32, 3, epilogues=True),
                                  FusionPolicy(64, 16, epilogues=True), FusionPolicy(12, 1, rows=True),
                                  FusionPolicy(12, 1, rows=True, attention=True),
                                  FusionPolicy(64, 16, epilogues=True, merges=True),
                                  FusionPolicy(64, 16, epilogues=True, merges=True, rows=True),
                                  FusionPolicy(64, 16, epilogues=True, merges=True, rows=True, attention=True),
                                  FusionPolicy(64, 16, epilogues=True, merges=True, rows=True, attention=True,
                                               rereads=False),
                                  FusionPolicy(64, 16, epilogues=True, merges=True, rows=True, heads=True))}


