"""`kiln bench coverage`: transformers causal LMs built tiny, exported, lowered and checked against
eager in the reference interpreter; the first op that stops a model is named and ranked."""
from __future__ import annotations

import torch

from kiln.frontend.coverage import LATENT, PROMPT, SHRINK, Row, _Logits, check, ranked_ops, tiny_config, tiny_model
from kiln.frontend.chosen_attention import NAME as CHOSEN_POSITIONS
from kiln.frontend.hf import lowering_implementations
from kiln.frontend.lower import lower
from kiln.ir import Op

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


def test_an_indexer_model_compiles_on_the_cpu_and_its_logits_match_eager(tmp_path):
    """`kiln bench coverage --compile`: the model that lowered is compiled (the real search and C
    kernels, a short budget) and run; its logits are held against eager's."""
    import kiln

    def compile_fn(module, ids):
        return kiln.compile(module, (ids,), budget=3, db=tmp_path / "tune.sqlite", progress=False)(ids.numpy())
    row = check("DeepseekV32ForCausalLM", compile_fn)
    assert row.stage == "lowered" and row.compiled_error is not None and row.compiled_error < 1e-4, row


def test_indexer_attention_reads_only_the_chosen_positions_and_equals_the_models_own():
    """Given its indexer's 4 of 7 positions, DeepSeek-V3.2's attention (and HY-V4's, with attention
    sinks) gathers 4 keys a query: eager through it equals the model's own dense attention under the
    indexer's mask, and the lowered graph scores 4 positions a query, never all 7."""
    ids = torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(2))
    heads, topk = LATENT["num_attention_heads"], LATENT["index_topk"]
    for arch in ("DeepseekV32ForCausalLM", "HYV4ForCausalLM"):
        model = tiny_model(arch, LATENT)
        with torch.no_grad():
            own = _Logits(model)(ids)
            with lowering_implementations(model):
                chosen = _Logits(model)(ids)
                graph = lower(_Logits(model), (ids,))
        assert torch.allclose(chosen, own, rtol=1e-4, atol=1e-5 * float(own.abs().max())), arch
        # attention's softmax [B, H, ..., k], one more with HY-V4's sink logit
        softmax = [n.shape for n in graph if n.op is Op.EXP2 and len(n.shape) >= 4 and n.shape[1] == heads]
        assert softmax and all(shape[-1] in (topk, topk + 1) for shape in softmax), (arch, softmax)
        gathered = [n for n in graph if n.op is Op.GATHER and n.shape[:-1] == (1, heads, PROMPT, topk)]
        assert len(gathered) >= 2, arch                            # the chosen keys and values


def test_a_model_whose_layers_hold_no_indexer_keeps_its_own_attention():
    """MiniMax-M3's layers say `indexer = None`: no indexer chooses positions, so the implementations
    it is lowered with leave its attention as it was; and the chosen-positions attention, given no
    indices, falls back to the model's own, causal (it once lost the causal mask there)."""
    ids = torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(3))
    model = tiny_model("MiniMaxM3VLForCausalLM", SHRINK)
    with torch.no_grad():
        own = _Logits(model)(ids)
        with lowering_implementations(model):
            lowered_with = _Logits(model)(ids)
        config = model.config.get_text_config()
        config._attn_implementation = CHOSEN_POSITIONS       # given no indices: the model's own, causal
        fallen_back = _Logits(model)(ids)
    # the experts run batched_mm there, grouped_mm here: equal up to summation order
    for logits in (lowered_with, fallen_back):
        assert torch.allclose(logits, own, rtol=1e-4, atol=1e-5 * float(own.abs().max()))
    assert check("MiniMaxM3VLForCausalLM").stage == "lowered"


def test_a_config_built_at_the_tiny_sizes_derives_the_sizes_that_depend_on_them():
    """Built from the tiny sizes (not set on a default config afterwards), a config derives its
    dependent fields itself: Bamba's and Zamba2's state-space head widths. A
    per-layer list of the default depth is cut to the tiny depth; sub-configs
    (Git's vision tower) shrink too; decoder-only fields of encoder-decoder families (PLBart's heads)
    are sized; a field a config refuses to have set (ProphetNet's num_hidden_layers) is left."""
    bamba = tiny_config("BambaForCausalLM", SHRINK)
    assert bamba.mamba_n_heads * bamba.mamba_d_head == bamba.mamba_expand * SHRINK["hidden_size"]
    zamba2 = tiny_config("Zamba2ForCausalLM", SHRINK)
    assert zamba2.mamba_headdim * zamba2.n_mamba_heads == zamba2.mamba_expand * SHRINK["hidden_size"]
    assert zamba2.layers_block_type == ["linear_attention"] * 2      # its first 2 of 54
    assert tiny_config("GitForCausalLM", SHRINK).vision_config.hidden_size == SHRINK["hidden_size"]
    assert tiny_config("PLBartForCausalLM", SHRINK).decoder_attention_heads == SHRINK["num_attention_heads"]
    for arch in ("BambaForCausalLM", "Zamba2ForCausalLM", "GitForCausalLM", "PLBartForCausalLM",
                 "ProphetNetForCausalLM", "HeliumForCausalLM", "MusicgenForCausalLM"):
        row = check(arch)
        assert row.stage == "lowered" and row.error < 1e-4, row


def test_a_model_that_will_not_build_small_is_named_with_why_not_the_fallbacks_size():
    # a drafter that runs on its main model's keys and values: not a standalone ids -> logits model
    row = check("Gemma4UnifiedAssistantForCausalLM")
    assert row.stage == "build" and "shared_kv_states" in row.detail, row


def test_a_model_that_does_not_lower_is_named_with_its_first_op():
    row = check(STOPPED[0])
    assert (row.stage, row.detail) == ("lower", STOPPED[1]), row


def test_ops_are_ranked_by_the_models_they_stop():
    rows = [Row("A", "lower", "aten.sort.default"), Row("B", "lower", "aten.polar.default"),
            Row("C", "lower", "aten.sort.default"), Row("D", "lowered", error=0.0), Row("E", "export", "x")]
    assert ranked_ops(rows) == [("aten.sort.default", 2), ("aten.polar.default", 1)]
