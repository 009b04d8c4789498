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
