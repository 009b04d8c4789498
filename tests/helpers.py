"""Small models the tests share."""
import torch


class Logits(torch.nn.Module):
    """A causal LM as ids -> logits (no cache), with an all-ones attention mask so that
    transformers adds no packed-sequence checks."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits


def tiny_llama(layers: int, seed: int = 0, **config):
    """A random Llama: hidden 32, MLP 64, 2 query heads sharing 1 KV head, vocabulary 64
    (`config`: other LlamaConfig fields)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                                           "num_hidden_layers": layers, "num_attention_heads": 2,
                                           "num_key_value_heads": 1, **config})).eval()


def tiny_moe(arch: str, **experts):
    """A mixture-of-experts LM as transformers builds it (its default "grouped_mm" experts, which
    lower_causal_lm exports as "batched_mm"): 4 experts, 2 a token, in every layer."""
    def make() -> torch.nn.Module:
        import transformers
        config = getattr(transformers, arch.replace("ForCausalLM", "Config"))(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, num_experts_per_tok=2, **experts)
        return getattr(transformers, arch)(config)
    return make


# the mixture-of-experts families the MoE issue names; GPT-OSS's sliding-window layers hold all
# of a cache no longer than their window
TINY_MOES = {"mixtral": tiny_moe("MixtralForCausalLM", num_local_experts=4),
             "qwen3_moe": tiny_moe("Qwen3MoeForCausalLM", num_experts=4, moe_intermediate_size=64),
             "olmoe": tiny_moe("OlmoeForCausalLM", num_experts=4),
             "gpt_oss": tiny_moe("GptOssForCausalLM", num_local_experts=4, head_dim=16)}
