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

import numpy as np
import torch

from .hf import lowering_implementations

# tiny sizes for whichever of these fields a config has; experts in every layer, 2 of 4 a token.
# Where a config will not build that small (its head sizes are fields of their own: MLA, state
# space layers), only the depth, the vocabulary and the experts shrink (FEWER).
FEWER = {"vocab_size": 128, "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "num_experts": 4,
         "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
         "first_k_dense_replace": 0, "decoder_sparse_step": 1,
         "pad_token_id": 0, "max_position_embeddings": 128, "n_positions": 128}
SHRINK = {**FEWER, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "n_embd": 64, "n_head": 4, "d_model": 64, "num_heads": 4, "moe_intermediate_size": 64}
# multi-head latent attention (DeepSeek-V2/V3 and the sparse-attention models built on it): its
# head sizes are fields of their own, the rotary's width is `head_dim`, no grouped keys; an
# indexer keeps 4 of the prompt's 7 positions, so its choice is exercised
LATENT = {**SHRINK, "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 8,
          "qk_nope_head_dim": 8, "qk_head_dim": 16, "v_head_dim": 16, "head_dim": 8,
          "index_n_heads": 2, "index_head_dim": 16, "index_topk": 4}
PROMPT = 7
MOST_PARAMETERS = 40_000_000   # a model its depth alone shrinks further than this is not tried


@dataclass
class Row:
    arch: str
    stage: str            # "lowered", or where it stopped: "build", "export", "lower", "mismatch"
    detail: str = ""      # the first ATen op that stopped it, or the error
    error: float | None = None     # the lowered logits against eager's, relative to their largest
    seconds: float = 0.0


def architectures() -> list[str]:
    import transformers
    return sorted(n for n in dir(transformers) if n.endswith("ForCausalLM") and not n.startswith(("TF", "Auto")))


def tiny_model(arch: str, sizes: dict[str, int]) -> torch.nn.Module:
    import transformers
    cls = getattr(transformers, arch)
    config = cls.config_class()
    text = config.get_text_config()
    for key, value in sizes.items():
        if hasattr(text, key) and (getattr(text, key) is None or isinstance(getattr(text, key), int)):
            setattr(text, key, value)
    with torch.device("meta"):          # counted before any memory is taken
        count = sum(p.numel() for p in cls(config).parameters())
    if count > MOST_PARAMETERS:
        raise ValueError(f"{count / 1e6:.0f}M parameters at this size")
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():
        # a matrix initialized to zeros (AFMoE's router) ties every expert, and PyTorch's top-k
        # breaks ties in an order of its implementation's, not the lowest index first
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.02)
    return model


def _built(arch: str, ids: torch.Tensor) -> tuple[torch.nn.Module, np.ndarray]:
    """The tiniest model of `arch` that runs, and its eager logits."""
    for sizes in (SHRINK, LATENT, FEWER):
        try:
            model = tiny_model(arch, sizes)
            with torch.no_grad(), lowering_implementations(model):     # as it is lowered
                return model, _Logits(model)(ids).float().numpy()
        except Exception as err:        # a config that will not build or run this small
            failure = err
    raise failure


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def check(arch: str) -> Row:
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
    return Row(arch, stage, error=error, seconds=time.monotonic() - start)


def sweep(archs: list[str] | None = None, progress=lambda row: None) -> list[Row]:
    rows = []
    for arch in archs or architectures():
        rows.append(check(arch))
        progress(rows[-1])
    return rows


def ranked_ops(rows: list[Row]) -> list[tuple[str, int]]:
    """The first ops that stopped models from lowering, most models first."""
    return Counter(r.detail for r in rows if r.stage == "lower" and r.detail.startswith("aten.")).most_common()
