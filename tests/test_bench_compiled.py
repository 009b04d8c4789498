"""`kiln bench compiled` on a 16-bit artifact: eager runs the same model in the artifact's dtype
(the comparison the speedup is of), and in float32 beside it (the eager a user of a CPU without
16-bit arithmetic would run), each from its own copy of the model."""
from __future__ import annotations

import copy

import torch

import kiln
from kiln.bench.compiled import measure
from kiln.frontend import catalog

SPEC = ("hf:LlamaForCausalLM hidden_size=64 intermediate_size=128 num_hidden_layers=2 num_attention_heads=4 "
        "num_key_value_heads=2 vocab_size=64 max_position_embeddings=64")


def test_the_cpu_bench_of_a_bf16_artifact_times_eager_in_bf16_and_in_float32(tmp_path):
    model = catalog.load(SPEC).model           # float32, its weights seeded
    kiln.compile_lm(copy.deepcopy(model).to(torch.bfloat16), max_seq=24, budget="5s", db=tmp_path / "tune.sqlite",
                    out=tmp_path / "artifact", progress=False)
    r = measure(str(tmp_path / "artifact"), SPEC, tokens=3, prompt_len=4)
    assert r["dtype"] == "bfloat16"
    assert r["eager_decode_tokens_per_s"] > 0 and r["eager_f32_decode_tokens_per_s"] > 0
    assert r["eager_f32_prefill_tokens_per_s"] > 0
    # the two eager runs are two models (converting one in place would make this 0) ...
    assert r["eager_decode_max_rel_error_vs_eager_f32"] > 0
    # ... and Kiln computes bf16's rounding: nearer eager in bf16 than in float32's own reach
    assert r["decode_max_rel_error_vs_eager"] <= r["decode_max_rel_error_vs_eager_f32"] + 1e-6
    assert r["decode_max_rel_error_vs_eager"] < 2e-2
