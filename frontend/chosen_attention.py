"""Sparse attention that reads only the positions an indexer chose.

DeepSeek-V3.2 and the models built on it (GLM-MoE-DSA, HY-V4, AXK2, Dots3) score every cached
position with a small indexer and keep its top k. Their eager and sdpa paths scatter those indices
into a mask over every position and run dense attention, so attention still reads every key and
value; any other attention implementation is handed the indices instead (`indices=`, meant for
flash-mla). Kiln registers one that gathers the chosen keys and values and attends over those k
alone: the lowered program reads k rows of the cache, not max_seq. A layer given no indices gets
its model's own eager attention."""
from __future__ import annotations

import sys

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

NAME = "kiln_chosen_positions"


def has_indexer(model: torch.nn.Module) -> bool:
    # a module, not merely the attribute: some models (MiniMax-M3) keep `indexer = None` in
    # layers that attend densely, and those must keep their own attention
    return any(isinstance(getattr(module, "indexer", None), torch.nn.Module) for module in model.modules())


def chosen_positions_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                               indices=None, s_aux=None, **kwargs):
    """query [B, H, S, D], key and value [B, Hkv, T, D], indices [B, S, k] distinct positions per
    query (a top-k's) -> ([B, S, H, Dv], None), softmax over the k chosen positions only (and the
    heads' sink logits `s_aux`, where the model has them: in the denominator, never attended)."""
    if indices is None:
        eager = sys.modules[type(module).__module__].eager_attention_forward
        return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                     **({} if s_aux is None else {"s_aux": s_aux}), **kwargs)
    batch, kv_heads = key.shape[:2]
    chosen = indices.long()[:, None]                                          # [B, 1, S, k]
    rows = torch.arange(batch, device=key.device)[:, None, None, None]
    heads = torch.arange(kv_heads, device=key.device)[None, :, None, None]
    keys, values = key[rows, heads, chosen], value[rows, heads, chosen]      # [B, Hkv, S, k, D]
    groups = query.shape[1] // kv_heads
    query = query.unflatten(1, (kv_heads, groups)).unsqueeze(-2)              # [B, Hkv, G, S, 1, D]
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = (query @ keys.unsqueeze(2).transpose(-1, -2)).squeeze(-2) * scale  # [B, Hkv, G, S, k]
    if attention_mask is not None:     # [B, 1, S, T]: what the causal mask says of the chosen
        mask = attention_mask.gather(-1, chosen.expand(attention_mask.shape[0], -1, -1, -1))
        mask = mask.unsqueeze(1)                                              # [B, 1, 1, S, k]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    if s_aux is not None:
        sinks = s_aux.reshape(1, kv_heads, groups, 1, 1).expand(*scores.shape[:-1], 1).to(scores.dtype)
        scores = torch.cat([scores, sinks], dim=-1)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    probs = probs if s_aux is None else probs[..., :-1]
    out = (probs.unsqueeze(-2) @ values.unsqueeze(2)).squeeze(-2)             # [B, Hkv, G, S, Dv]
    return out.flatten(1, 2).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, chosen_positions_attention)
# eager's mask, always materialized: sdpa's is None where the mask is merely causal (sdpa then
# passes is_causal), which would leave the chosen positions and the fallback unmasked
AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
