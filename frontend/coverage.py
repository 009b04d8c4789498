"""`kiln bench coverage`: which transformers causal LMs Kiln can lower. Every `*ForCausalLM` class
is built from its default config shrunk to a tiny size (the fields below, where the config has
them), run as `forward(ids) -> logits` through torch.export and `kiln.lower`, and the lowered
graph's logits are compared with eager's in the reference interpreter. A model that does not
lower is listed with the first ATen op that stopped it, and the ops are ranked by how many
models they stop."""
from __future__ import annotations

import re
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .hf import lowering_implementations

# tiny sizes for whichever of these fields a config has; experts in every layer, 2 of 4 a token.
# Where a config will not build that small (its head sizes are fields of their own: MLA, state
# space layers), only the depth, the vocabulary and the experts shrink (FEWER). Encoder-decoder
# families' decoders count their layers and heads in fields of their own; one shared expert; no
# layer reusing an earlier one's keys and values (Gemma 3n/4: that needs a producer of each
# attention type first, more than 2 layers hold).
FEWER = {"vocab_size": 128, "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "num_experts": 4,
         "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
         "first_k_dense_replace": 0, "decoder_sparse_step": 1, "n_shared_experts": 1,
         "pad_token_id": 0, "max_position_embeddings": 128, "n_positions": 128,
         "encoder_layers": 2, "decoder_layers": 2, "num_encoder_layers": 2, "num_decoder_layers": 2,
         "num_kv_shared_layers": 0, "vocab_size_per_layer_input": 128, "encoder_hash_byte_group_vocab": 128}
SHRINK = {**FEWER, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "n_embd": 64, "n_head": 4, "n_heads": 4, "d_model": 64, "num_heads": 4, "moe_intermediate_size": 64,
          "head_dim": 16, "rotary_dim": 8, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
          "num_encoder_attention_heads": 4, "num_decoder_attention_heads": 4, "encoder_ffn_dim": 128,
          "decoder_ffn_dim": 128, "ffn_dim": 128, "hidden_size_per_layer_input": 16, "hidden_size_global": 64,
          "n_groups": 1}
# fields one architecture needs set, given to its config as it is built (a sub-config's as a dict)
OWN = {
    # one audio codebook, so the ids stay [1, 7] (it reads [batch x codebooks, seq]); not a general
    # rule: CSM's depth decoder embeds each position's own codebook and needs one a position
    **{arch: {"num_codebooks": 1} for arch in ("MusicgenForCausalLM", "MusicgenMelodyForCausalLM")},
    # its state-space heads times head_dim must equal 2 x hidden_size (4 x 32), head_dim no attention's
    "Mamba2ForCausalLM": {"head_dim": 32},
    # its default config leaves the layer types None (LFM2's derives them): one of each kind
    "Lfm2MoeForCausalLM": {"layer_types": ["conv", "full_attention"]},
    # the model reads a rotary per layer type where the default config has none at all
    "CohereCompassForCausalLM": {"rope_parameters": {"full_attention": {"rope_type": "default",
                                                                         "rope_theta": 10000.0}}},
    # each hybrid layer's shared transformer is tied to the first's: two of them, or the tie finds none
    "ZambaForCausalLM": {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"]},
    # its rotary covers partial_rotary_factor (0.5 by default) of head_dim, the queries' and keys'
    # whole width: twice the latent sizes' rotary part, not DeepSeek's head_dim (the rotary's own)
    "Mistral4ForCausalLM": {"head_dim": 16},
    # the model reads the rotary base from the attention's sub-config, which transformers' default
    # leaves without one, and clamps q, k, v to clip_qkv even where that is None; the experts are
    # sized in the feed-forward's sub-config
    "DbrxForCausalLM": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0},
                        "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}},
}
# multi-head latent attention (DeepSeek-V2/V3 and the sparse-attention models built on it): its
# head sizes are fields of their own, the rotary's width is `head_dim`, no grouped keys; an
# indexer keeps 4 of the prompt's 7 positions, so its choice is exercised
LATENT = {**SHRINK, "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 8,
          "qk_nope_head_dim": 8, "qk_head_dim": 16, "v_head_dim": 16, "head_dim": 8,
          "index_n_heads": 2, "index_head_dim": 16, "index_topk": 4}
PROMPT = 7
MOST_PARAMETERS = 40_000_000   # a model its depth alone shrinks further than this is not tried


class TooLarge(ValueError):
    pass


@dataclass
class Row:
    arch: str
    stage: str            # "lowered", or where it stopped: "build", "export", "lower", "mismatch"
    detail: str = ""      # the first ATen op that stopped it, or the error
    error: float | None = None     # the lowered logits against eager's, relative to their largest
    seconds: float = 0.0
    compiled_error: float | None = None    # the compiled model's logits against eager's, where asked


def architectures() -> list[str]:
    import transformers
    return sorted(n for n in dir(transformers) if n.endswith("ForCausalLM") and not n.startswith(("TF", "Auto")))


def _fits(config, key: str) -> bool:
    """Whether `config` has the field `key` unset or as an int (a string or list of that name stays)."""
    try:
        value = getattr(config, key)
    except Exception:       # absent, or a per-layer field a heterogeneous config will not read globally
        return False
    return value is None or isinstance(value, int)


def _depth(config) -> int | None:
    return next((getattr(config, k) for k in ("num_hidden_layers", "n_layer", "num_layers")
                 if _fits(config, k) and getattr(config, k)), None)


def _rebuilt(config, sizes: dict[str, int], own: dict):
    """`config`'s class built again at the tiny `sizes` of the fields it has, its sub-configs (text,
    vision, audio, ...) likewise. Built from them, the fields its `__post_init__` derives from them
    (head widths, per-layer types, state-space heads) follow; set afterwards, they kept the
    defaults'. A per-layer list as long as the default depth (Zamba2's block types) is cut to the
    tiny depth: its first layers, the ones a tiny model built on the whole list would read. (Each
    kind's first layer would exercise more, but stops Inkling2, whose "hybrid" layers unfold, and
    Qwen4-Exp, whose indexer layers the default config leaves unsized.)"""
    from transformers import PretrainedConfig
    kwargs = {key: value for key, value in sizes.items() if _fits(config, key)}
    depth, tiny_depth = _depth(config), sizes.get("num_hidden_layers")
    for key, value in vars(config).items():
        if isinstance(value, PretrainedConfig):
            kwargs[key] = _rebuilt(value, sizes, {})
        elif isinstance(value, list) and depth and tiny_depth and len(value) == depth > tiny_depth:
            kwargs[key] = value[:tiny_depth]
    kwargs.update(own)
    try:
        return type(config)(**kwargs)
    except Exception:   # a size its constructor refuses: set field by field, as they fit
        for key, value in kwargs.items():
            try:
                setattr(config, key, value)
            except Exception:   # a field it will not have set (ProphetNet's num_hidden_layers)
                pass
        return config


def tiny_config(arch: str, sizes: dict[str, int]):
    """`arch`'s default config at the tiny `sizes`, with its own fields (OWN)."""
    import transformers
    return _rebuilt(getattr(transformers, arch).config_class(), sizes, OWN.get(arch, {}))


def tiny_model(arch: str, sizes: dict[str, int]) -> torch.nn.Module:
    import transformers
    cls = getattr(transformers, arch)
    config = tiny_config(arch, sizes)
    with torch.device("meta"):          # counted before any memory is taken
        count = sum(p.numel() for p in cls(config).parameters())
    if count > MOST_PARAMETERS:
        raise TooLarge(f"{count / 1e6:.0f}M parameters at this size")
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():
        # a matrix initialized to zeros (AFMoE's router) ties every expert, and PyTorch's top-k
        # breaks ties in an order of its implementation's, not the lowest index first
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.02)
    if hasattr(model, "set_default_language"):     # X-MOD's adapters: one per language, none by default
        model.set_default_language(config.languages[0])
    return model


def _built(arch: str, ids: torch.Tensor) -> tuple[torch.nn.Module, np.ndarray]:
    """The tiniest model of `arch` that runs, and its eager logits."""
    failures = []
    for sizes in (SHRINK, LATENT, FEWER):
        try:
            model = tiny_model(arch, sizes)
            with torch.no_grad(), lowering_implementations(model):     # as it is lowered
                return model, _Logits(model)(ids).float().numpy()
        except Exception as err:        # a config that will not build or run this small
            failures.append(err)
    # the reason it would not build small, not merely that the larger fallback was too large
    raise next((e for e in failures if not isinstance(e, TooLarge)), failures[-1])


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def check(arch: str, compile_fn: Callable[[torch.nn.Module, torch.Tensor], np.ndarray] | None = None) -> Row:
    """`compile_fn(module, ids)`: a model that lowers and matches is also compiled and run by it
    (the caller's compiler: the frontend imports none), its logits held against eager's."""
    from ..ir import ExportError, KilnError, UnsupportedOp, run
    from ..ir.tensors import to_numpy
    from .lower import lower
    start = time.monotonic()
    ids = torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    try:
        model, want = _built(arch, ids)
    except Exception as err:
        return Row(arch, "build", f"{type(err).__name__}: {str(err)[:120]}", seconds=time.monotonic() - start)
    try:
        with lowering_implementations(model), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = lower(_Logits(model), (ids,))
    except UnsupportedOp as err:
        op = re.search(r"aten\.[\w.]+", str(err))
        return Row(arch, "lower", op[0] if op else str(err)[:120], seconds=time.monotonic() - start)
    except ExportError as err:
        return Row(arch, "export", str(err)[:120], seconds=time.monotonic() - start)
    except KilnError as err:
        return Row(arch, "lower", str(err)[:120], seconds=time.monotonic() - start)
    got = np.asarray(run(graph, [to_numpy(ids)])[0], dtype=np.float32)
    error = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)) if got.shape == want.shape else np.inf
    stage = "lowered" if error <= 1e-4 else "mismatch"
    compiled_error = None
    if compile_fn is not None and stage == "lowered":
        with lowering_implementations(model), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = np.asarray(compile_fn(_Logits(model), ids), dtype=np.float32)
        compiled_error = (float(np.abs(compiled - want).max() / max(np.abs(want).max(), 1e-30))
                          if compiled.shape == want.shape else np.inf)
    return Row(arch, stage, error=error, seconds=time.monotonic() - start, compiled_error=compiled_error)


def sweep(archs: list[str] | None = None, progress=lambda row: None, compile_fn=None) -> list[Row]:
    rows = []
    for arch in archs or architectures():
        rows.append(check(arch, compile_fn))
        progress(rows[-1])
    return rows


def ranked_ops(rows: list[Row]) -> list[tuple[str, int]]:
    """The first ops that stopped models from lowering, most models first."""
    return Counter(r.detail for r in rows if r.stage == "lower" and r.detail.startswith("aten.")).most_common()
