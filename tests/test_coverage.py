"""`kiln bench coverage`: transformers causal LMs built tiny, exported, lowered and checked against
eager in the reference interpreter; the first op that stops a model is named and ranked."""
from __future__ import annotations

from kiln.frontend.coverage import LATENT, PROMPT, Row, check, ranked_ops

# expert sizes read back to the host (.tolist()) to split the tokens: shapes that depend on data
STOPPED = ("JetMoeForCausalLM", "aten._local_scalar_dense")


def test_dense_mixture_of_experts_complex_rotary_and_integer_mask_lms_lower_and_match_eager():
    for arch in ("LlamaForCausalLM", "MixtralForCausalLM", "Llama4ForCausalLM", "CpmAntForCausalLM"):
        row = check(arch)
        assert row.stage == "lowered" and row.error < 1e-4, row


def test_sparse_attention_indexers_lower_and_match_eager_while_choosing_positions():
    assert LATENT["index_topk"] < PROMPT      # the indexer's mask leaves positions out
    for arch in ("DeepseekV32ForCausalLM", "HYV4ForCausalLM"):
        row = check(arch)
        assert row.stage == "lowered" and row.error < 1e-4, row


def test_a_model_that_does_not_lower_is_named_with_its_first_op():
    row = check(STOPPED[0])
    assert (row.stage, row.detail) == ("lower", STOPPED[1]), row


def test_ops_are_ranked_by_the_models_they_stop():
    rows = [Row("A", "lower", "aten.sort.default"), Row("B", "lower", "aten.polar.default"),
            Row("C", "lower", "aten.sort.default"), Row("D", "lowered", error=0.0), Row("E", "export", "x")]
    assert ranked_ops(rows) == [("aten.sort.default", 2), ("aten.polar.default", 1)]
