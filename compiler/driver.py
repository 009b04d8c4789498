"""`kiln.compile` and `kiln.compile_lm`: lower, search every graph within the budget (with a
progress display), and return a `CompiledModel`. A compile journals its id next to the output
folder, so `resume=True` after an interrupt continues the same search: every candidate and kernel
already measured is read back from the tuning database, never measured again."""
from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..ir import Graph, KilnError, decode
from ..ir.last_position import last_position, prompt_args
from ..ir.artifact import check_writable
from ..runtime.backend import Evicting
from ..runtime.compiled import CompiledGraph
from ..runtime.hardware import fingerprint_id
from ..runtime.model import CompiledModel, fingerprint, make_backend
from ..search.budget import Deadline, parse_budget
from ..search.tunedb import TuneDB
from .loop import GraphReport, compile_graph
from .progress import CompileDisplay
from .worker import IsolatedEvaluate, check_width

TUNE_SEQ = 32             # the prompt length decode's caches come from, and prefill's first bucket
LONG_PROMPTS = (512, 2048)   # ... and the lengths of the longer prefill buckets (where max_seq has room)
DECODE_SHARE = 0.6        # of the budget: decode is what serving repeats
DEFAULT_BUDGET_S = 600.0
LONG_CONTEXT = 1024       # decode from this position on runs a program tuned on a long context


def _journal_path(out: Path) -> Path:
    return out.parent / f".{out.name}.kiln-compile.json"


def compile_id_for(out: str | Path | None, resume: bool, what: str,
                   db: str | Path | None = None, budget_s: float | None = None) -> str:
    """A fresh id, recorded beside `out` with the tuning database's path (where `kiln report`
    finds a running compile's candidates), the budget and when the search began; with resume,
    the id of the interrupted compile there."""
    return _journal(out, resume, what, db, budget_s)["compile_id"]


def interrupted(out: str | Path) -> dict:
    """The journal an interrupted compile into `out` left (checked before the model is loaded)."""
    try:
        return json.loads(_journal_path(Path(out)).read_text())
    except (OSError, json.JSONDecodeError):
        raise KilnError(f"kiln: there is no interrupted compile to resume for {out}; "
                        "run the compile without --resume") from None


def _journal(out: str | Path | None, resume: bool, what: str, db: str | Path | None,
             budget_s: float | None) -> dict:
    if out is None:
        if resume:
            raise KilnError("kiln: resume needs the output folder of the interrupted compile")
        return {"compile_id": uuid.uuid4().hex}
    check_writable(Path(out))
    journal = _journal_path(Path(out))
    if resume:
        data = interrupted(out)
        if data.get("what") != what:
            raise KilnError(f"kiln: the interrupted compile for {out} was of {data.get('what')}, "
                            f"not {what}; run without --resume to start afresh")
        return data
    journal.parent.mkdir(parents=True, exist_ok=True)
    data = {"compile_id": uuid.uuid4().hex, "what": what,
            "db": str(Path(db if db is not None else TuneDB.default_path()).expanduser().absolute()),
            "budget_s": budget_s, "started_at": time.time()}
    tmp = journal.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, journal)
    return data


def _resumed_budget(journal: dict, db: str | Path | None, budget_s: float | None,
                    show: bool) -> float:
    """On resume, the budget given anew, else what the interrupted compile had left of its own
    (its search ran from when it began to its last journaled candidate); says what it reads back."""
    with TuneDB(db if db is not None else TuneDB.default_path()) as tunedb:
        candidates, kernels, last = tunedb.recorded_since(journal["compile_id"], journal.get("started_at", 0.0))
    spent = max(0.0, (last or journal.get("started_at", 0.0)) - journal.get("started_at", 0.0))
    if budget_s is None:
        budget_s = max(0.0, (journal.get("budget_s") or DEFAULT_BUDGET_S) - spent)
    if show:
        print(f"resuming: {candidates} candidates and {kernels} kernel timings from the database "
              f"({spent:.0f} s searched before); {budget_s:.0f} s of search left", flush=True)
    return budget_s


def finish_journal(out: str | Path | None) -> None:
    if out is not None:
        _journal_path(Path(out)).unlink(missing_ok=True)


def _search(graphs: dict[str, tuple[Graph, list[np.ndarray], float]], budget: Deadline, *, backend,
            backend_name: str, db_path, compile_id: str, seed: int, display: CompileDisplay, max_candidates: int,
            workers: int | None = None) -> tuple[dict[str, CompiledGraph], dict, dict]:
    """Each graph (graph, call inputs, weight) searched within its weight's share of the budget
    left when it starts on `backend` (made before the model was lowered: a machine without the
    backend is told at once): the budget is wall time, what one graph overran the next ones lose."""
    hardware = fingerprint(backend_name)
    # the tuning database's key: the hardware, and how the backend times (measurements taken one
    # way, warm caches or cold weights, are never ranked against ones taken the other)
    timing = {"timing": backend.timing} if isinstance(backend, Evicting) else {}
    tuning_key = fingerprint_id({**hardware, **timing})
    compiled, reports = {}, {}
    with TuneDB(db_path or TuneDB.default_path()) as db:
        worker = IsolatedEvaluate(backend_name, db.path, tuning_key, width=workers)   # for every graph
        try:
            left = sum(weight for _, _, weight in graphs.values())
            for name, (graph, args, weight) in graphs.items():
                seconds = budget.share(weight, left).remaining()
                left -= weight
                display.stage(f"searching {name}: {seconds:,.0f} s of the {budget.remaining():,.0f} s "
                              "left of the budget")
                compiled[name], report = compile_graph(
                    graph, backend, args, seconds, db, tuning_key, compile_id=f"{compile_id}:{name}",
                    seed=seed, max_candidates=max_candidates, isolate=worker,
                    on_progress=lambda p, left, name=name: display.region(name, p, left))
                reports[name] = _report_json(report, compiled[name])
                reports[name]["compile_id"] = f"{compile_id}:{name}"
        finally:
            worker.close()
        bandwidth, db_path = backend.copy_bandwidth(), str(db.path)
    for r in reports.values():
        r.update(db=db_path, copy_bytes_per_s=bandwidth)
    return compiled, reports, hardware


def _report_json(report: GraphReport, compiled: CompiledGraph) -> dict:
    regions = []
    for r in report.regions:
        row = {k: v for k, v in asdict(r).items() if k not in ("progress", "stages")}
        row["stages"] = [asdict(s) for s in r.stages]
        row["progress"] = {k: v for k, v in asdict(r.progress).items()}
        regions.append(row)
    return {"regions": regions, "kernels_measured": report.kernels_measured,
            "worker_restarts": report.worker_restarts, "seconds": report.seconds, "kernels": compiled.kernel_count,
            "peak_bytes": compiled.peak_bytes}


def compile_lm(model, max_seq: int = 256, backend: str = "cpu", budget: str | float | None = None,
               db: str | Path | None = None, out: str | Path | None = None, resume: bool = False,
               tokenizer=None, seed: int = 0, progress: bool = True,
               max_candidates: int = 100_000, lowered=None, all_logits: bool = False,
               name: str | None = None, workers: int | None = None) -> CompiledModel:
    """Compile a transformers causal LM (batch 1, static KV cache of max_seq positions) into a
    prefill program and a decode program, each searched and tuned on this machine. `lowered`:
    graphs already lowered (`frontend.hf.load_lowered`), for a machine whose torch cannot export
    the model. Prefill's logits are the last position's ([1, 1, vocab], what generation samples
    from) unless `all_logits`. `budget`: wall time after lowering (10 minutes by default; with
    `resume`, what the interrupted compile had left unless given). `name`: the model's, as the
    report and `kiln info` show it (its architecture otherwise). `workers`: processes measuring
    candidates side by side (compiler/worker.py: default_width by default)."""
    from ..frontend import hf
    given = budget if isinstance(budget, (int, float)) or budget is None else parse_budget(budget)
    traced_seq = lowered.max_seq if lowered is not None else max_seq
    what = hashlib.sha256(f"lm {type(model).__name__} {model.config.to_json_string()} {traced_seq} "
                          f"{backend} {all_logits}".encode()).hexdigest()[:16]
    seconds = given if given is not None else DEFAULT_BUDGET_S
    check_width(backend, workers)
    runner = make_backend(backend)      # a machine without it is told before anything is written
    journal = _journal(out, resume, what, db, seconds)     # checked before minutes of lowering
    if resume:
        seconds = _resumed_budget(journal, db, given, progress)
    compile_id = journal["compile_id"]
    with CompileDisplay(progress) as display:
        if lowered is None:
            display.stage(f"lowering {name or type(model).__name__} (prefill and decode, max_seq {max_seq})")
            lowered = hf.lower_causal_lm(model, max_seq)
        display.stage(f"a {seconds:,.0f} s budget starts: the reference run decode is tuned on")
        return _compile_lowered(model, lowered, deadline=Deadline(seconds), backend=backend, runner=runner,
                                db=db, out=out,
                                tokenizer=tokenizer, seed=seed, display=display, max_candidates=max_candidates,
                                all_logits=all_logits, name=name, compile_id=compile_id, seconds=seconds,
                                workers=workers)


def _compile_lowered(model, lowered, *, deadline: Deadline, backend: str, runner, db, out, tokenizer, seed: int,
                     display: CompileDisplay, max_candidates: int, all_logits: bool, name: str | None,
                     compile_id: str, seconds: float, workers: int | None) -> CompiledModel:
    """compile_lm after lowering: what the budget (`deadline`) covers."""
    from ..frontend import hf
    from ..ir.tensors import kiln_dtype
    max_seq = lowered.max_seq
    rng = np.random.default_rng(seed)
    tune_seq = max(2, min(TUNE_SEQ, max_seq - 1))
    prompt = rng.integers(0, lowered.vocab_size, size=(1, tune_seq), dtype=np.int64)
    # decode is tuned on the caches a real prompt leaves (the reference interpreter's prefill)
    _, caches = hf.prefill(lowered, prompt)
    token = rng.integers(0, lowered.vocab_size, size=(1, 1), dtype=np.int64)
    decode_programs = decode_buckets(max_seq)
    decode_share = DECODE_SHARE / len(decode_programs)
    # prefill in length buckets: a kernel configuration (or a cuBLAS call) that wins at 32 tokens
    # can lose badly at 500, so long prompts run a program tuned at a long length
    buckets = prefill_buckets(max_seq)
    prompts = {name: prompt if n == tune_seq else rng.integers(0, lowered.vocab_size, size=(1, n), dtype=np.int64)
               for name, n in buckets.items()}
    prefill_share = (1 - DECODE_SHARE) / len(buckets)
    prefill = lowered.prefill if all_logits else last_position(lowered.prefill, at_length=True)
    compiled, reports, hardware = _search(
        {**{name: (lowered.decode, decode.decode_args(lowered.decode, token, pos, caches), decode_share)
            for name, (pos, _) in decode_programs.items()},
         **{name: (prefill, prompt_args(prefill, prompts[name]), prefill_share) for name in buckets}},
        deadline, backend=runner, backend_name=backend, db_path=db, compile_id=compile_id, seed=seed,
        display=display,
        max_candidates=max_candidates, workers=workers)
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    info = {"vocab_size": lowered.vocab_size, "max_seq": max_seq,
            "cache_shape": list(lowered.cache.shape), "cache_dtype": kiln_dtype(lowered.cache.dtype).value,
            "layers": lowered.cache.layers, "eos_token_id": eos, "prefill_buckets": buckets,
            "prefill_logits": "all" if all_logits else "last",
            "decode_buckets": {name: start for name, (_, start) in decode_programs.items()},
            "architecture": type(model).__name__, "model": name or type(model).__name__,
            **_spent(seconds, deadline)}
    result = CompiledModel("lm", compiled, info, hardware, tokenizer, {"graphs": reports})
    if out is not None:
        display.stage(f"saving {out}")
        result.save(out)
        finish_journal(out)
    return result


def prefill_buckets(max_seq: int) -> dict[str, int]:
    """The prefill programs a causal LM gets, by graph name, with the prompt length each is tuned
    at: "prefill" at TUNE_SEQ, then "prefill_N" at N = min(L, max_seq - 1) for each of
    LONG_PROMPTS where that is at least four times the bucket before (a 2,048-token prompt's
    attention and products choose otherwise than a 512-token one's)."""
    buckets = {"prefill": max(2, min(TUNE_SEQ, max_seq - 1))}
    for length in LONG_PROMPTS:
        n = min(length, max_seq - 1)
        if n >= 4 * max(buckets.values()):
            buckets[f"prefill_{n}"] = n
    return buckets


def decode_buckets(max_seq: int) -> dict[str, tuple[int, int]]:
    """The decode programs a causal LM gets, by graph name: (the position it is tuned at, the
    first position it serves). "decode" is tuned at TUNE_SEQ; where max_seq holds more than twice
    LONG_CONTEXT, "decode_long" serves positions from LONG_CONTEXT on, tuned halfway between it and
    max_seq: attention's choices (a context split among blocks, softmax merged into P.V or apart)
    that win over 33 positions lose over thousands, and the other way round."""
    programs = {"decode": (max(2, min(TUNE_SEQ, max_seq - 1)), 0)}
    if max_seq > 2 * LONG_CONTEXT:
        programs["decode_long"] = ((LONG_CONTEXT + max_seq) // 2, LONG_CONTEXT)
    return programs


def compile(module, args: tuple, dynamic_shapes=None, backend: str = "cpu",
            budget: str | float = "10m", db: str | Path | None = None, seed: int = 0,
            progress: bool = True, max_candidates: int = 100_000, workers: int | None = None) -> CompiledModel:
    """Compile any module torch.export accepts; call the result like the module."""
    from ..frontend.lower import lower
    from ..ir.tensors import to_numpy
    import torch
    from torch.utils import _pytree as pytree
    seconds = budget if isinstance(budget, (int, float)) else parse_budget(budget)
    check_width(backend, workers)
    runner = make_backend(backend)
    with CompileDisplay(progress) as display:
        display.stage(f"lowering {type(module).__name__}")
        graph = lower(module, args, dynamic_shapes=dynamic_shapes)
        deadline = Deadline(seconds)
        arrays = [to_numpy(a) for a in pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]
        compiled, reports, hardware = _search({"forward": (graph, arrays, 1.0)}, deadline, backend=runner,
                                              backend_name=backend,
                                              db_path=db, compile_id=uuid.uuid4().hex, seed=seed,
                                              display=display, max_candidates=max_candidates, workers=workers)
    return CompiledModel("module", compiled, _spent(seconds, deadline), hardware, None, {"graphs": reports})


def _spent(seconds: float, deadline: Deadline) -> dict:
    """The budget and the time the compile took after lowering: past the budget by the work
    that cannot stop at a deadline (each region's program as lowered is always checked and timed,
    and a winner's kernels are built)."""
    took = deadline.elapsed()
    return {"budget_s": seconds, "took_s": took, "over_budget_s": max(0.0, took - seconds)}
