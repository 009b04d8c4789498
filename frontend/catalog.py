"""MODEL arguments of the CLI: a named model, a local transformers folder, or
`hf:<Architecture> key=value ...` (random weights from a transformers config)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from ..ir import KilnError

# Shapes with random weights: Llama-3.2-1B (the GPU anchors in the design notes use it), a MoE.
NAMED_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-3.2-1b": ("LlamaForCausalLM", dict(
        hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=8192, vocab_size=128256, max_position_embeddings=131072,
        rope_theta=500000.0, tie_word_embeddings=True, head_dim=64)),
    # Qwen3-30B-A3B's mixture of experts scaled to 1.16B parameters: 64 experts, 4 a token (its 1/16),
    # 250M read a decode token (the chosen experts, attention, the output head)
    "qwen3-moe-1b": ("Qwen3MoeForCausalLM", dict(
        hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
        moe_intermediate_size=256, num_experts=64, num_experts_per_tok=4, vocab_size=151936,
        tie_word_embeddings=False, max_position_embeddings=40960, rope_theta=1000000.0)),
}


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: Any = None


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise KilnError(f"kiln: expected key=value after the architecture, got '{pair}'")
        key, raw = pair.split("=", 1)
        out[key] = _parse_value(raw)
    return out


def _parse_value(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def from_config(arch: str, overrides: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    import transformers
    cls = getattr(transformers, arch, None)
    if cls is None or not hasattr(cls, "config_class"):
        raise KilnError(f"kiln: transformers has no model class '{arch}' "
                        "(expected e.g. hf:LlamaForCausalLM hidden_size=64 num_hidden_layers=2)")
    try:
        config = cls.config_class(**overrides)
    except (TypeError, ValueError) as err:
        raise KilnError(f"kiln: bad config for {arch}: {err}") from None
    torch.manual_seed(seed)
    return cls(config).eval()


def load(spec: str) -> LoadedModel:
    """Resolve a MODEL argument: 'smollm2', 'minilm', a named config, a folder, or 'hf:Arch k=v'."""
    from . import hf
    parts = spec.split()
    head = parts[0] if parts else ""
    if head == "smollm2":
        model, tok = hf.load_smollm2()
        return LoadedModel("smollm2", model, tok)
    if head == "minilm":
        model, tok = hf.load_minilm()
        return LoadedModel("minilm", model, tok)
    if head in NAMED_CONFIGS:
        arch, config = NAMED_CONFIGS[head]
        return LoadedModel(head, from_config(arch, {**config, **parse_overrides(parts[1:])}))
    if head.startswith("hf:"):
        return LoadedModel(head[3:], from_config(head[3:], parse_overrides(parts[1:])))
    if os.path.isdir(head):
        return _load_folder(head)
    known = ", ".join(["smollm2", "minilm", *NAMED_CONFIGS])
    raise KilnError(f"kiln: unknown model '{spec}'; give one of {known}, a local transformers "
                    "folder, or hf:<Architecture> key=value ...")


def _load_folder(path: str) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    except (OSError, ValueError) as err:
        raise KilnError(f"kiln: cannot load a causal LM from {path}: {err}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        tokenizer = None
    return LoadedModel(path, model.eval(), tokenizer)
