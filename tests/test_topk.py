"""aten.topk lowered as k rounds of max over the elements not taken yet (issue 17: MoE routers),
against PyTorch on fresh random inputs: values equal; indices equal where no two candidates tie,
and where they do (integers, bf16), valid, distinct and giving the values; ties go to the lower
index, as the lowering's docstring says."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kiln.frontend.lower import lower
from kiln.ir.tensors import from_numpy, to_numpy
from kiln.ir import run


class TopK(torch.nn.Module):
    def __init__(self, k: int, dim: int, largest: bool):
        super().__init__()
        self.k, self.dim, self.largest = k, dim, largest

    def forward(self, x):
        return torch.topk(x, self.k, dim=self.dim, largest=self.largest)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
@pytest.mark.parametrize("k, dim, largest", [(2, -1, True), (8, -1, True), (3, 1, False), (1, 0, True)])
def test_topk_equals_pytorch(dtype, k, dim, largest):
    """Integers in -5..5 and bf16 values tie within a row: there the indices need only be valid."""
    gen = torch.Generator().manual_seed(k * 7 + dim)
    x = (torch.randint(-5, 6, (4, 12, 16), generator=gen) if dtype is torch.int64
         else torch.randn(4, 12, 16, generator=gen)).to(dtype)
    module = TopK(k, dim, largest)
    want_values, want_indices = module(x)
    values, indices = run(lower(module, (x,)), [to_numpy(x)])
    got = torch.from_numpy(np.asarray(indices))
    assert torch.equal(from_numpy(values), want_values)
    assert torch.equal(torch.gather(x, dim, got), want_values)          # they index the values
    assert (got.sort(dim).values.diff(dim=dim) > 0).all()               # each element once
    if dtype is torch.float32:                                          # no ties
        assert torch.equal(got, want_indices)


def test_ties_go_to_the_lower_index():
    x = torch.tensor([[3.0, 7.0, 7.0, 1.0, 7.0]])
    values, indices = run(lower(TopK(3, -1, True), (x,)), [x.numpy()])
    assert np.asarray(values).tolist() == [[7.0, 7.0, 7.0]] and np.asarray(indices).tolist() == [[1, 2, 4]]
