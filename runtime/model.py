"""`CompiledModel`: compiled graphs plus what serving needs (cache layout, vocabulary, tokenizer),
saved as an artifact folder of JSON, kernel sources and safetensors, and loaded without running
anything from it: the stored graphs are scheduled and rendered again, and the rendered kernels
must equal the stored sources."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..codegen.c_runner import is_runner
from ..ir import DType, Graph, KilnError, regions as regionlib
from ..ir.decode import decode_args
from ..ir.last_position import prompt_args
from ..ir.serialize import graph_from_json, graph_to_json, resolve_spec
from ..ir.artifact import read_artifact, write_artifact
from .compiled import Choice, CompiledGraph
from .hardware import describe_mismatch, fingerprint_id
from ..ir.generation import generate_tokens

BACKENDS = ("cpu", "cuda")


def make_backend(name: str):
    if name == "cpu":
        from .cpu import CpuBackend
        return CpuBackend()
    if name == "cuda":
        from .cuda import CudaBackend
        return CudaBackend()
    raise KilnError(f"kiln: unknown backend '{name}'; use one of {', '.join(BACKENDS)}")


def fingerprint(backend_name: str) -> dict:
    from .hardware import fingerprint_cpu, fingerprint_cuda
    info = {"backend": backend_name, **fingerprint_cpu()}
    return {**info, **fingerprint_cuda()} if backend_name == "cuda" else info


class CompiledModel:
    """`kind` "lm": graphs "decode" and "prefill" (plus "prefill_N", tuned at N tokens; `info`
    "prefill_buckets" names them; and "decode_long", tuned on a long context, `info`
    "decode_buckets" giving the position it serves from) sharing a static KV cache (`info` holds vocab_size, max_seq,
    cache_shape, layers...); kind "module": one graph "forward"."""

    def __init__(self, kind: str, graphs: dict[str, CompiledGraph], info: dict[str, Any],
                 hardware: dict, tokenizer=None, report: dict | None = None, tokenizer_folder: Path | None = None):
        """`tokenizer_folder`: where a tokenizer is saved, loaded on first use of `tokenizer`
        (importing transformers takes seconds that `kiln generate` and `kiln info` need not pay)."""
        self.kind, self.graphs, self.info = kind, graphs, info
        self.hardware, self.report = hardware, report or {}
        self._tokenizer, self.tokenizer_folder = tokenizer, tokenizer_folder

    @property
    def tokenizer(self):
        """transformers' tokenizer of the model, where it was compiled with one."""
        if self._tokenizer is None and self.tokenizer_folder is not None:
            from transformers import AutoTokenizer
            self._tokenizer = AutoTokenizer.from_pretrained(str(self.tokenizer_folder), local_files_only=True)
        return self._tokenizer

    @property
    def backend(self) -> str:
        return self.hardware["backend"]

    # --- running ------------------------------------------------------------------------------
    def __call__(self, *args):
        """A module: the module's inputs as torch tensors (or numpy arrays), outputs structured as
        the module returns them. An LM: ids [1, T] -> logits (through prefill): [1, 1, vocab], the
        last position's, or [1, T, vocab] where compiled with all_logits."""
        import torch
        from torch.utils import _pytree as pytree
        from ..ir.tensors import from_numpy, to_numpy
        if self.kind == "lm":
            logits = self._prefill(np.asarray(to_numpy(args[0]) if isinstance(args[0], torch.Tensor)
                                              else args[0], dtype=np.int64))
            return from_numpy(logits) if isinstance(args[0], torch.Tensor) else logits
        graph = self.graphs["forward"]
        leaves = [a for a in pytree.tree_leaves(args) if isinstance(a, (torch.Tensor, np.ndarray))]
        torch_in = any(isinstance(a, torch.Tensor) for a in leaves)
        outs = graph.host(*(to_numpy(a) if isinstance(a, torch.Tensor) else a for a in leaves))
        if torch_in:
            outs = [from_numpy(o) for o in outs]
        spec = resolve_spec(graph.graph.out_spec)
        return pytree.tree_unflatten(outs, spec) if spec is not None else outs

    def _zero_caches(self) -> list:
        shape, dtype = tuple(self.info["cache_shape"]), DType(self.info["cache_dtype"]).np
        backend = self.graphs["decode"].backend
        return [backend.input(np.zeros(shape, dtype)) for _ in range(2 * self.info["layers"])]

    def _prefill(self, ids: np.ndarray) -> np.ndarray:
        logits, self._caches = self.prefill(ids)
        return logits

    def prefill(self, ids: np.ndarray) -> tuple[np.ndarray, list]:
        """ids [1, T] -> the logits generation reads (the last position's unless compiled with
        all_logits), on the host, and the KV caches, where the backend keeps them. Where the
        program replays recordings (CUDA graphs), a prompt is padded to the next of a few
        lengths (32, 64, 128, ...: ir/last_position.py), so that a few recordings serve them all."""
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise KilnError(f"kiln: expected token ids of shape [1, T], got {list(ids.shape)}")
        if ids.shape[1] == 1:   # torch.export fixes prefill lengths at 2 and up: decode on an empty cache
            caches = self._zero_caches()
            return self._decode(ids, 0, caches), caches
        graph = self.prefill_graph(ids.shape[1])
        logits, *caches = graph(*prompt_args(graph.graph, ids, pad=graph.records))
        return graph.backend.to_host(logits, graph.graph.outputs[0].dtype), caches

    def prefill_graph(self, length: int) -> CompiledGraph:
        """The prefill program for a prompt of `length` tokens: the one tuned at the shortest
        length at or above it, else the longest."""
        buckets = self.info.get("prefill_buckets", {"prefill": 0})
        fits = [(n, name) for name, n in buckets.items() if n >= length]
        return self.graphs[min(fits)[1] if fits else max((n, name) for name, n in buckets.items())[1]]

    def decode_graph(self, pos: int) -> CompiledGraph:
        """The decode program for a step at `pos`: the one whose positions start latest at or
        before it ("decode" from 0, "decode_long" from info's decode_buckets)."""
        buckets = self.info.get("decode_buckets", {"decode": 0})
        return self.graphs[max((start, name) for name, start in buckets.items() if start <= pos)[1]]

    def _decode(self, ids: np.ndarray, pos: int, caches: list) -> np.ndarray:
        graph = self.decode_graph(pos)
        logits, *_ = graph(*decode_args(graph.graph, ids, pos, caches))
        return graph.backend.to_host(logits, graph.graph.outputs[0].dtype)

    def generate(self, input_ids, max_new_tokens: int = 32, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, eos_token_id: int | list[int] | None = None, streamer=None):
        """transformers' `generate` for batch 1: prefill the prompt, then one decode step per new
        token with the KV cache as state. Returns the prompt and the new tokens, as a LongTensor
        [1, T + new] for tensor input or a list of ints for list input."""
        if self.kind != "lm":
            raise KilnError("kiln: generate() needs a causal LM compiled with compile_lm")
        torch = sys.modules.get("torch")       # a tensor's caller loaded it; a list's need not
        as_tensor = torch is not None and isinstance(input_ids, torch.Tensor)
        ids = input_ids.reshape(-1).tolist() if as_tensor else [int(t) for t in np.asarray(input_ids).reshape(-1)]
        if eos_token_id is None:
            eos_token_id = self.info.get("eos_token_id")
        caches: list[np.ndarray] = []

        def prefill(prompt: np.ndarray) -> np.ndarray:
            logits, fresh = self.prefill(prompt)
            caches[:] = fresh
            return logits

        def decode(token: int, pos: int) -> np.ndarray:
            return self._decode(np.array([[token]], dtype=np.int64), pos, caches)

        new = generate_tokens(prefill, decode, ids, max_new_tokens,
                              vocab_size=self.info["vocab_size"], max_seq=self.info["max_seq"],
                              do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                              seed=seed, eos_token_id=eos_token_id, streamer=streamer)
        return torch.tensor([ids + new], dtype=torch.long) if as_tensor else ids + new

    # --- artifacts ----------------------------------------------------------------------------
    def save(self, folder: str | Path) -> None:
        files: dict[str, bytes | str] = {}
        weights: dict[str, np.ndarray] = {}
        for name, compiled in self.graphs.items():
            files[f"graphs/{name}.json"] = json.dumps(_graph_record(compiled))
            weights.update(compiled.graph.weights)
            for fn, src in compiled.sources.items():
                files[f"kernels/{fn}{compiled.backend.source_suffix}"] = src
        if self.tokenizer is not None:
            with tempfile.TemporaryDirectory() as tmp:
                self.tokenizer.save_pretrained(tmp)
                for path in Path(tmp).rglob("*"):
                    if path.is_file():
                        files[f"tokenizer/{path.relative_to(tmp)}"] = path.read_bytes()
        from .. import __version__
        files["report.json"] = json.dumps(self.report)
        files["manifest.json"] = json.dumps({
            "kiln_version": __version__, "kind": self.kind, "graphs": sorted(self.graphs),
            "info": self.info, "hardware": self.hardware, "hardware_id": fingerprint_id(self.hardware),
            "tokenizer": self.tokenizer is not None,
        }, indent=2)
        write_artifact(Path(folder), files, weights)

    @staticmethod
    def load(folder: str | Path, check_hardware: bool = True) -> CompiledModel:
        from .. import __version__
        manifest, open_file, tensors = read_artifact(Path(folder))
        if manifest.get("kiln_version") != __version__:
            raise KilnError(f"kiln: {folder} was compiled by Kiln {manifest.get('kiln_version')}, "
                            f"this is Kiln {__version__}; compile the model again")
        hardware = manifest.get("hardware") or {}
        here = fingerprint(hardware.get("backend", "cpu"))
        differs = describe_mismatch(hardware, here)
        if differs and check_hardware:
            raise KilnError(f"kiln: {folder} was tuned on other hardware: {differs}; compile it "
                            "again here (or load with check_hardware=False to run it untuned)")
        backend = make_backend(hardware.get("backend", "cpu"))
        graphs, parsed = {}, {}
        for name in manifest["graphs"]:
            record = _json(open_file(f"graphs/{name}.json"), folder, name)
            graphs[name] = _compiled_from_record(record, tensors, backend, folder, parsed)
            for fn, src in graphs[name].sources.items():
                path = f"kernels/{fn}{backend.source_suffix}"
                # region runners are made from the programs, like kernels; an artifact written
                # before there were runners has none to compare (its programs are checked)
                present = (Path(folder) / path).is_file()
                if is_runner(fn) and not present:
                    continue
                if not present or open_file(path).decode() != src:
                    # kernels are named by their sources' hashes: another build of Kiln renders
                    # (or, for a library call, implements) them otherwise
                    what = "differs from what this Kiln renders" if present else "(as this Kiln renders it) is missing"
                    raise KilnError(f"kiln: {folder}: kernel {fn} {what}: the artifact was written by "
                                    "another build of Kiln, or altered; compile it again")
        report = _json(open_file("report.json"), folder, "report")
        return CompiledModel(manifest["kind"], graphs, manifest["info"], hardware, None, report,
                             Path(folder) / "tokenizer" if manifest.get("tokenizer") else None)


def _json(raw: bytes, folder, what: str) -> dict:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise KilnError(f"kiln: the artifact {folder} is corrupted: {what}: {err}") from err


def _graph_record(compiled: CompiledGraph) -> dict:
    """The graph, each distinct region's chosen program, and the split into regions: each
    region's key and label, and the graph's nodes (by their place in its evaluation order) that
    flow into it and that it computes, so that a load need not split the graph again (1-2 s a
    graph of SmolLM2 on the CPU, most of a load)."""
    reps = {}
    for region in compiled.regions:
        reps.setdefault(region.key, region)
    choices = {}
    for key, choice in compiled.choices.items():
        program = Graph(inputs=list(reps[key].inputs), outputs=list(choice.outputs))
        choices[key] = {"program": graph_to_json(program), "variant": choice.variant,
                        "configs": [c.to_json() for c in choice.configs]}
    place = {id(n): i for i, n in enumerate(compiled.graph.nodes())}
    regions = [{"key": r.key, "label": r.label, "feeds": [place[id(n)] for n in r.feeds],
                "produces": [place[id(n)] for n in r.produces]} for r in compiled.regions]
    return {"graph": graph_to_json(compiled.graph), "choices": choices, "regions": regions}


def _stored_regions(graph: Graph, stored: list[dict], programs: dict[str, Graph]) -> list[regionlib.Region]:
    """The regions a record stores, over `graph` (whose evaluation order numbers the nodes)."""
    order = graph.nodes()
    return [regionlib.Region(k, r["label"], list(programs[r["key"]].inputs), list(programs[r["key"]].outputs),
                             [order[i] for i in r["feeds"]], [order[i] for i in r["produces"]], r["key"])
            for k, r in enumerate(stored)]


def _compiled_from_record(record: dict, tensors: dict, backend, folder, parsed: dict) -> CompiledGraph:
    """`parsed`: graphs already read by this load, with their regions, by their JSON: the prefill
    buckets hold one graph, and splitting it into regions is most of a load's time."""
    try:
        text = json.dumps(record["graph"], sort_keys=True)
        if text not in parsed:
            graph = graph_from_json(record["graph"])
            graph.weights = {n.attrs["name"]: tensors[n.attrs["name"]] for n in graph.weight_nodes()}
            parsed[text] = graph, {}
        graph, split = parsed[text]
        choices, programs = {}, {}
        for key, c in record["choices"].items():
            programs[key] = program = graph_from_json(c["program"])
            choices[key] = Choice(program.outputs, c["variant"],
                                  [backend.config_from_json(x) for x in c["configs"]])
        stored = record.get("regions")
        if stored is not None:
            regions = _stored_regions(graph, stored, programs)
        else:       # written before records held the split
            if "regions" not in split:
                split["regions"] = regionlib.split(graph)
            regions = split["regions"]
        keys = {r.key for r in regions}
        if keys - choices.keys():
            raise KeyError(f"regions without a choice: {sorted(keys - choices.keys())}")
    except (KeyError, TypeError, ValueError) as err:
        raise KilnError(f"kiln: the artifact {folder} is corrupted: {err}") from err
    return CompiledGraph(graph, choices, backend, regions)
