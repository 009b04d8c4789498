"""The `kiln` command line. Errors Kiln raises on purpose print as one line and exit non-zero."""
from __future__ import annotations

import functools
import os
import sys
import time
import warnings

import click

from .ir import KilnError


def _clean_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KilnError as err:
            message = str(err)
            click.echo(message if message.startswith("kiln:") else f"kiln: {message}", err=True)
            sys.exit(1)
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tensorkiln")
def main() -> None:
    """Kiln: a search-based tensor compiler.

    A PyTorch model is lowered to a small primitive IR whose meaning is defined by a numpy
    reference interpreter. MODEL arguments name a model: 'smollm2' (SmolLM2-135M-Instruct, real
    weights, offline), 'minilm', 'llama-3.2-1b' (that shape, random weights), 'qwen3-moe-1b'
    (Qwen3-MoE scaled to 1.16B parameters, 64 experts, 4 a token, random weights), a local
    transformers folder, or 'hf:<Architecture> key=value ...' (random weights from a config).
    """
    # torch.export's own pytree code trips a deprecation inside torch on every export: noise here
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)


@main.command()
@click.option("--unsupported", is_flag=True, help="List only the ATen ops Kiln refuses, with reasons.")
def ops(unsupported: bool) -> None:
    """List the primitives and the ATen ops Kiln lowers (and those it refuses, with why)."""
    from .frontend.lower import op_name
    from .frontend.registry import UNSUPPORTED, all_lowerings
    from .ir.ops import OPS
    if not unsupported:
        click.echo("primitives: " + ", ".join(op.value for op in OPS))
        names = sorted({f"aten.{op_name(t)}" for t in all_lowerings()})
        click.echo(f"\nATen ops with a lowering ({len(names)}):")
        click.echo("  " + "\n  ".join(", ".join(names[i:i + 6]) for i in range(0, len(names), 6)))
    else:
        all_lowerings()
    click.echo(f"\nATen overloads refused on purpose ({len(UNSUPPORTED)}):")
    for target, reason in sorted(UNSUPPORTED.items(), key=lambda kv: str(kv[0])):
        click.echo(f"  {target}: {reason}")
    click.echo("\nAny other ATen op is not lowered yet: 'kiln: cannot lower aten.X' names it and "
               "where the model uses it.")


@main.command()
@click.argument("model")
@click.option("--max-seq", default=256, show_default=True, help="Longest sequence the graph accepts.")
@click.option("--decode", is_flag=True, help="Show the one-token decode graph instead of prefill.")
@click.option("--full", is_flag=True, help="Print every node (the default trims the middle).")
@_clean_errors
def show(model: str, max_seq: int, decode: bool, full: bool) -> None:
    """Lower MODEL and print its IR: a summary, then one line per node."""
    from .frontend import catalog, hf
    from .ir.printer import format_graph, summary
    loaded = catalog.load(model).model
    spec = hf.cache_spec(loaded, max_seq)
    graph = hf.lower_decode(loaded, spec) if decode else hf.lower_prefill(loaded, spec)
    click.echo(summary(graph))
    click.echo(format_graph(graph, max_lines=None if full else 60))


@main.command()
@click.argument("model", default="smollm2")
@click.option("--prompt", default="The capital of France is", show_default=True)
@click.option("--max-new-tokens", default=16, show_default=True, type=click.IntRange(1, None))
@click.option("--max-seq", default=256, show_default=True, help="Longest sequence the graph accepts.")
@_clean_errors
def reference(model: str, prompt: str, max_new_tokens: int, max_seq: int) -> None:
    """Greedy continuation of PROMPT computed by the reference interpreter (slow, exact).

    This is the ground truth that compiled programs are checked against.
    """
    from .frontend import catalog, hf
    loaded = catalog.load(model)
    if loaded.tokenizer is None:
        raise KilnError(f"kiln: {model} carries no tokenizer; the reference run needs one")
    ids = loaded.tokenizer(prompt)["input_ids"]
    lowered = hf.lower_causal_lm(loaded.model, max_seq=max_seq)
    new = hf.reference_generate(lowered, ids, max_new_tokens,
                                eos_token_id=loaded.tokenizer.eos_token_id)
    click.echo(prompt + loaded.tokenizer.decode(new, skip_special_tokens=True))


@main.group()
def bench() -> None:
    """Benchmarks: figures printed side by side with their anchors, from one run."""


_BENCH_MODELS = ("smollm2", "llama-3.2-1b")


@bench.command("frontend")
@click.argument("models", nargs=-1, metavar="[MODEL]...")
@click.option("--tokens", default=8, show_default=True, help="Decode steps timed per model.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the figures here.")
@_clean_errors
def bench_frontend(models: tuple[str, ...], tokens: int, json_path: str | None) -> None:
    """Export and lowering time, IR node counts, and interpreter time per token, for each MODEL
    (default: smollm2 and llama-3.2-1b)."""
    from .bench.frontend import run_frontend_bench
    run_frontend_bench(list(models or _BENCH_MODELS), tokens, json_path)


@bench.command("coverage")
@click.option("--arch", "archs", multiple=True, metavar="NAME",
              help="A transformers *ForCausalLM class to try (repeat for several; default: every one).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the rows here.")
@click.option("--compile", "budget", metavar="BUDGET",
              help="Also compile each model that lowers on the CPU backend within BUDGET (5s, 1m, ...; "
                   "a tuning database of its own in a temporary folder) and hold its logits against eager's.")
@_clean_errors
def bench_coverage(archs: tuple[str, ...], json_path: str | None, budget: str | None) -> None:
    """Which transformers causal LMs lower: each built tiny from its default config, exported as
    ids -> logits, lowered and checked against eager in the reference interpreter; the first
    ATen op that stops each other one, ranked by how many it stops."""
    import dataclasses
    import json
    import tempfile
    from .frontend.coverage import ranked_ops, sweep
    compile_fn = None
    if budget is not None:
        from .compiler.driver import compile as compile_module
        from .search.budget import parse_budget
        seconds, db = parse_budget(budget), tempfile.mkdtemp(prefix="kiln-coverage-")

        def compile_fn(module, ids):
            compiled = compile_module(module, (ids,), budget=seconds, db=f"{db}/tune.sqlite", progress=False)
            return compiled(ids.numpy())
    rows = sweep(list(archs) or None, compile_fn=compile_fn, progress=lambda r: click.echo(
        f"{r.arch:44s} {r.stage:9s} {r.detail or (f'max error {r.error:.1e}' if r.error is not None else '')}"
        + (f", compiled {r.compiled_error:.1e}" if r.compiled_error is not None else "")
        + f"  ({r.seconds:.1f} s)"))
    stages = {stage: sum(r.stage == stage for r in rows) for stage in ("lowered", "mismatch", "lower", "export", "build")}
    click.echo(f"\n{stages['lowered']} of {len(rows)} lower and match eager; " +
               ", ".join(f"{n} {stage}" for stage, n in stages.items() if n and stage != "lowered") +
               " (where each stopped: 'lower' an op without a lowering, 'mismatch' logits that differ)")
    if budget is not None:
        ran = [r for r in rows if r.compiled_error is not None]
        click.echo(f"compiled on the CPU within {budget} each: {sum(r.compiled_error <= 1e-4 for r in ran)} of "
                   f"{len(ran)} match eager (worst {max((r.compiled_error for r in ran), default=0):.1e})")
    for op, n in ranked_ops(rows):
        click.echo(f"  {n:3d}  {op}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump([dataclasses.asdict(r) for r in rows], f, indent=1)


@bench.command("search")
@click.argument("models", nargs=-1, metavar="[MODEL]...")
@click.option("--graph", "which", type=click.Choice(["prefill", "decode"]), default="prefill",
              show_default=True, help="Which of the model's graphs to search.")
@click.option("--candidates", default=1000, show_default=True, type=click.IntRange(1, None),
              help="Distinct candidates to draw per distinct region.")
@click.option("--budget", default="10s", show_default=True,
              help="Extraction time per distinct region: 10s, 2m, ...")
@click.option("--check", default=20, show_default=True, type=click.IntRange(0, None),
              help="Candidates per region checked against the reference interpreter.")
@click.option("--no-whole", is_flag=True, help="Skip saturating the whole graph without dedupe.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the figures here.")
@_clean_errors
def bench_search(models: tuple[str, ...], which: str, candidates: int, budget: str, check: int,
                 no_whole: bool, json_path: str | None) -> None:
    """Saturation, layer dedupe and candidate extraction for each MODEL (default: smollm2 and
    llama-3.2-1b): sizes, times, distinct valid candidates."""
    from .bench.search import run_search_bench
    from .search.budget import parse_budget
    run_search_bench(list(models or _BENCH_MODELS), which, candidates, parse_budget(budget), check, json_path,
                     whole=not no_whole)


@bench.command("compiled")
@click.argument("artifact", type=click.Path())
@click.argument("spec", metavar="[MODEL]", default="smollm2")
@click.option("--tokens", default=64, show_default=True, type=click.IntRange(3, None),
              help="Decode steps timed.")
@click.option("--prompt-len", "prompt_len", default=64, show_default=True, type=click.IntRange(2, None),
              help="Prompt tokens for the prefill timing.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the figures here.")
@_clean_errors
def bench_compiled(artifact: str, spec: str, tokens: int, prompt_len: int, json_path: str | None) -> None:
    """Decode and prefill tokens/s of a compiled ARTIFACT beside PyTorch eager running MODEL, the
    model it was compiled from (default: smollm2), in one run: eager in the artifact's dtype, and
    for a 16-bit artifact in float32 too."""
    from .bench.compiled import run_compiled_bench
    run_compiled_bench(artifact, spec, tokens, prompt_len, json_path)


@main.command("chart")
@click.argument("json_path", metavar="JSON", type=click.Path(exists=True, dir_okay=False))
@_clean_errors
def chart(json_path: str) -> None:
    """Draw the PNG chart of a `kiln bench gpu --json` result, beside it (bench.json: bench.png)."""
    from .bench.gpu import write_chart
    click.echo(write_chart(json_path))


@bench.command("gpu")
@click.argument("model", default="llama-3.2-1b")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16",
              show_default=True)
@click.option("--tokens", default=128, show_default=True, type=click.IntRange(8, None),
              help="Decode steps timed after warm-up.")
@click.option("--budget", default="5m", show_default=True, help="Kiln's search budget.")
@click.option("--max-seq", default=704, show_default=True, type=click.IntRange(16, None),
              help="KV-cache length (room for the prefill prompt and the decode steps).")
@click.option("--torch-compile/--no-torch-compile", default=True, show_default=True,
              help="Also time torch.compile(mode='max-autotune') (minutes of compile).")
@click.option("--db", type=click.Path(dir_okay=False), help="Tuning database.")
@click.option("--lowered", "lowered_path", metavar="FOLDER",
              help="A folder of graphs 'kiln lower' wrote (where this torch cannot export the model).")
@click.option("--prefill", default=512, show_default=True, type=click.IntRange(2, None),
              help="Prompt length timed for prefill (at most max-seq - tokens - 16).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Also write the figures here, and a PNG chart beside it.")
@click.option("--at-position", "positions", multiple=True, type=click.IntRange(0, None),
              help="Also time Kiln's decode from this cache position (repeat for several): a "
                   "step's cost as the context grows.")
@click.option("--artifact", type=click.Path(file_okay=False, exists=True),
              help="Time this artifact (from `kiln compile` of the same model, --dtype and --max-seq) "
                   "instead of compiling: a compile longer than one sitting, continued with --resume.")
@_clean_errors
def bench_gpu(model: str, dtype: str, tokens: int, budget: str, max_seq: int, torch_compile: bool,
              db: str | None, lowered_path: str | None, prefill: int, json_path: str | None,
              positions: tuple[int, ...], artifact: str | None) -> None:
    """Decode and prefill tokens/s of PyTorch eager, torch.compile and Kiln (CUDA) on one GPU,
    in one run, with the copy bandwidth measured in the same run and each one's share of the
    bandwidth bound; the decode kernels that take the most time."""
    from .bench.gpu import run_gpu_bench
    run_gpu_bench(model, dtype, tokens, budget, max_seq, torch_compile, json_path, db, lowered_path=lowered_path,
                  prefill=prefill, positions=positions, artifact=artifact)


@main.command("lower")
@click.argument("model")
@click.option("--out", required=True, metavar="FOLDER",
              help="Writes the folder: lowered.json (the graphs), weights.safetensors (the small weights), "
                   "manifest.json (checksums, checked on load); replaced whole, never half-written.")
@click.option("--max-seq", default=256, show_default=True, type=click.IntRange(2, None))
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True)
@_clean_errors
def lower_cmd(model: str, out: str, max_seq: int, dtype: str) -> None:
    """Lower MODEL's prefill and decode graphs and save them (JSON, small weights in safetensors).

    For a machine whose torch cannot export the model: compile there from these graphs, with
    the weights taken from its own copy of the model (only those it lacks are saved).
    """
    import torch
    from .frontend import catalog, hf
    lm = catalog.load(model).model.to(getattr(torch, dtype))
    hf.save_lowered(hf.lower_causal_lm(lm, max_seq), out, lm)
    click.echo(f"wrote {out}/")


@main.group()
def rules() -> None:
    """Rewrite rules: what the library holds, whether a rule is sound, whether the search uses it."""


def _selected_rulesets(topics: tuple[str, ...], files: tuple[str, ...]) -> list:
    from .rewrites.registry import library
    from .search.rulesets import load_file
    lib = library()
    unknown = [t for t in topics if t not in lib]
    if unknown:
        raise KilnError(f"kiln: no ruleset '{unknown[0]}'; topics: {', '.join(sorted(lib))}")
    chosen = [lib[t] for t in topics] + [load_file(f) for f in files]
    return chosen or list(lib.values())


def _columns(rows: list[tuple[str, ...]], indent: str = "  ") -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


@rules.command("check")
@click.option("--ruleset", "topics", multiple=True, metavar="TOPIC",
              help="A ruleset of the library to check (repeat for several; default: all of them).")
@click.option("--rules", "files", multiple=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="A rule file outside the package (a draft) to check (repeatable).")
@click.option("--programs", default=200, show_default=True, type=click.IntRange(1, None),
              help="Random programs to saturate (up to 4x as many while a rule fired in fewer than 3).")
@click.option("--seed", default=0, show_default=True, help="Seed of the random programs and inputs.")
@_clean_errors
def rules_check(topics: tuple[str, ...], files: tuple[str, ...], programs: int, seed: int) -> None:
    """Fuzz rules for soundness; exit 1 if one is unsound or never fires.

    Random small programs are saturated with the rules, and every e-node of every e-class is
    evaluated with numpy: two members of one e-class that disagree name the rule that merged
    them, with the smallest program that shows it.
    """
    from .rewrites.fuzz import check
    report = check(_selected_rulesets(topics, files), programs=programs, seed=seed)
    if not report.ok:
        click.echo(report.format())
        sys.exit(1)
    rows = [(r.full_name, f"fired in {report.fired_in.get(r.full_name, 0)} programs",
             f"({report.fired[r.full_name]} matches)") for r in report.rules]
    click.echo(_columns(rows))
    click.echo(f"ok: {report.summary()}")


@rules.command("list")
@click.argument("model", required=False)
@click.option("--artifact", type=click.Path(), help="A compiled artifact: per region, the rewrites its "
              "winner needs (without any one of them the e-graph no longer holds it) and the rules that fired.")
@_clean_errors
def rules_list(model: str | None, artifact: str | None) -> None:
    """List the library's rules; with MODEL, how often each matched when its lowered prefill
    graph was saturated; with --artifact, which of them each region's winner needs.

    Each rule with its stage and why ("finite-only": sound within rounding wherever both sides
    stay finite, as a reassociated product is); disabled rules with their reason.
    """
    if artifact is not None:
        _winner_rules(artifact)
        return
    from .rewrites.registry import library
    lib = library()
    fired: dict[str, int] | None = None
    if model is not None:
        from .frontend import catalog, hf
        from .search.saturate import saturate
        loaded = catalog.load(model).model
        graph = hf.lower_prefill(loaded, hf.cache_spec(loaded, max_seq=64))
        result = saturate(graph.outputs, list(lib.values()))
        fired = {}
        click.echo(f"{model} prefill, {len(graph.nodes())} IR nodes, saturated with the library:")
        for stage in result.stages:
            click.echo(f"  stage {stage.stage}: {stage.iterations} iterations, {stage.enodes:,} e-nodes, "
                       f"{stage.eclasses:,} e-classes, {stage.seconds:.2f} s, {stage.stop}")
            for name, count in stage.matches.items():
                fired[name] = fired.get(name, 0) + count
        click.echo()
    rows = [("rule", "stage", *(("matches",) if fired is not None else ()), "why")]
    for topic, rs in sorted(lib.items(), key=lambda kv: kv[0]):
        for r in rs.rules:
            count = (str(fired.get(r.full_name, 0)),) if fired is not None else ()
            rows.append((r.full_name, rs.stage, *count, ("finite-only: " if r.finite_only else "") + r.why))
    click.echo(_columns(rows, indent=""))
    disabled = [(rule.full_name, reason) for _, rs in sorted(lib.items())
                for reason, rule in rs.disabled.values()]
    if disabled:
        click.echo("\ndisabled (kept out of every stage):")
        click.echo(_columns(disabled))


def _winner_rules(artifact: str) -> None:
    import json
    from pathlib import Path
    from .ir.artifact import read_artifact
    from .rewrites.registry import library
    _, open_file, _ = read_artifact(Path(artifact))
    facts = {r.full_name for rs in library().values() if rs.stage == "analysis" for r in rs.rules}
    for name, graph in json.loads(open_file("report.json")).get("graphs", {}).items():
        for r in graph["regions"]:
            fired = sorted({rule for s in r["stages"] for rule, n in s["matches"].items() if n and rule not in facts})
            if r["winner"].startswith("original/"):
                needs = "the program as lowered: no rewrite"
            elif "rules" not in r:
                needs = "not recorded by this compile"
            else:
                needs = ", ".join(r["rules"]) or "none of the rules that fired"
                if r.get("rules_undecided"):
                    needs += f" (not checked in time: {', '.join(r['rules_undecided'])})"
            click.echo(f"{name} / {r['label']}: winner {r['winner']}{_gains_text(r)}")
            click.echo(f"  needs: {needs}")
            click.echo(f"  fired: {', '.join(fired) or 'none'}")


@main.command()
@click.argument("model")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Folder to write the compiled artifact to (replaced atomically when it exists).")
@click.option("--backend", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--budget", help="Wall time for everything after lowering (search, checks, build): 90s, "
              "10m, 2h, 1h30m ... [default: 10m; with --resume, what the interrupted compile had left]")
@click.option("--max-seq", default=256, show_default=True, type=click.IntRange(2, None),
              help="KV cache positions: the longest prompt plus generated tokens.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="Weights and activations.")
@click.option("--resume", is_flag=True, help="Continue the interrupted compile that wrote to --out, "
              "re-measuring nothing it finished.")
@click.option("--db", type=click.Path(dir_okay=False),
              help="Tuning database (default: $KILN_TUNING_DB or ~/.cache/kiln/tuning.sqlite).")
@click.option("--seed", default=0, show_default=True, help="Seed of the candidate draws and sample inputs.")
@click.option("--report", "report", is_flag=True,
              help="Also write the compile report (OUT/report.html, see 'kiln report').")
@click.option("--workers", type=click.IntRange(1, None), metavar="N",
              help="Processes measuring candidates side by side, taking turns on the device to check "
                   "and time. [default: 1 on the CPU; half the cores, at most 8, with a GPU]")
@click.option("--lowered", "lowered_path", metavar="FOLDER",
              help="A folder of graphs 'kiln lower' wrote on a machine whose torch can export MODEL (this "
                   "one's cannot); MODEL still gives the weights, the graphs their max-seq and dtype.")
@click.option("--all-logits", is_flag=True,
              help="Prefill computes logits for every prompt position (for scoring a text); by "
                   "default only the last position's, the one generation samples from.")
@_clean_errors
def compile(model: str, out: str, backend: str, budget: str | None, max_seq: int, dtype: str, resume: bool,
            db: str | None, seed: int, report: bool, workers: int | None, lowered_path: str | None,
            all_logits: bool) -> None:
    """Compile MODEL (a causal LM) for this machine and write an artifact folder.

    Every candidate program is checked against the reference interpreter and timed here; the
    fastest wins. Measurements go to the tuning database as they are made, so an interrupted
    compile continues with --resume, and a later compile re-measures nothing.
    """
    import torch
    from .frontend import catalog, hf
    from pathlib import Path
    from .ir.artifact import check_writable
    from .compiler.driver import compile_lm, interrupted
    from .compiler.worker import check_width
    from .runtime.model import make_backend
    from .search.budget import parse_budget
    seconds = parse_budget(budget) if budget is not None else None
    check_writable(Path(out))          # before minutes of loading and lowering, not after
    if resume:
        interrupted(out)
    check_width(backend, workers)
    make_backend(backend)              # CuPy and a GPU, or a C compiler: before the model loads
    if lowered_path and not os.path.isdir(lowered_path):
        raise KilnError(f"kiln: no folder {lowered_path}; write it with 'kiln lower MODEL --out {lowered_path}'")
    started = time.monotonic()
    click.echo(f"loading {model}")
    loaded = catalog.load(model)
    lm = loaded.model.to(getattr(torch, dtype))
    lowered = hf.load_lowered(lowered_path, lm) if lowered_path else None
    click.echo(f"loaded {loaded.name}" + (f" and its lowered graphs ({lowered_path})" if lowered else "") +
               f" in {time.monotonic() - started:.0f} s; the compile's clock starts now")
    compiled = compile_lm(lm, max_seq=max_seq, backend=backend, budget=seconds, db=db, out=out,
                          resume=resume, tokenizer=loaded.tokenizer, seed=seed, lowered=lowered,
                          all_logits=all_logits, name=loaded.name, workers=workers)
    graphs = compiled.report["graphs"]
    kernels = ", ".join(f"{name} {g['kernels']} kernels" for name, g in graphs.items())
    click.echo(f"wrote {out}: {loaded.name}, {backend}, {kernels}")
    info = compiled.info
    over = (f", {info['over_budget_s']:.0f} s past it (each region's program as lowered is always "
            "checked and timed)" if info["over_budget_s"] >= 1 else "")
    click.echo(f"searched {info['took_s']:.0f} s after lowering, of a {info['budget_s']:.0f} s budget{over}")
    if report:
        from .report.page import write_report
        click.echo(f"report: {write_report(out)}")


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--prompt", default="The capital of France is", show_default=True)
@click.option("--max-new-tokens", default=32, show_default=True, type=click.IntRange(1, None))
@click.option("--sample", "do_sample", is_flag=True, help="Sample instead of greedy decoding.")
@click.option("--temperature", default=1.0, show_default=True)
@click.option("--top-k", type=click.IntRange(1, None))
@click.option("--top-p", type=float)
@click.option("--seed", type=int, help="Seed for sampling: the same seed gives the same text.")
@_clean_errors
def generate(artifact: str, prompt: str, max_new_tokens: int, do_sample: bool, temperature: float,
             top_k: int | None, top_p: float | None, seed: int | None) -> None:
    """Generate from a compiled ARTIFACT, streaming the text as it comes."""
    from .runtime.model import CompiledModel
    from .runtime.text import TextStream, Tokenizer
    model = CompiledModel.load(artifact)
    if model.tokenizer_folder is None:
        raise KilnError(f"kiln: {artifact} carries no tokenizer; use CompiledModel.generate() with "
                        "token ids")
    if Tokenizer.available(model.tokenizer_folder):
        tokenizer = Tokenizer(model.tokenizer_folder)
        ids, streamer = tokenizer.encode(prompt), TextStream(tokenizer)
    else:       # a tokenizer without a tokenizer.json: transformers' own
        from transformers import TextStreamer
        ids = model.tokenizer(prompt)["input_ids"]
        streamer = TextStreamer(model.tokenizer, skip_special_tokens=True)
    model.generate(ids, max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature,
                   top_k=top_k, top_p=top_p, seed=seed, streamer=streamer)


@main.command()
@click.argument("artifact", type=click.Path())
@_clean_errors
def info(artifact: str) -> None:
    """What a compiled ARTIFACT holds: model, hardware, graphs, kernels and the search's figures."""
    import json
    from pathlib import Path
    from .ir.artifact import read_artifact
    manifest, open_file, tensors = read_artifact(Path(artifact))
    report = json.loads(open_file("report.json"))
    hw = manifest.get("hardware", {})
    model = manifest["info"].get("model") or manifest["info"].get("architecture", "")
    click.echo(f"{artifact}: {manifest.get('kind')} {model} ({manifest['info'].get('architecture', '')}), "
               f"Kiln {manifest.get('kiln_version')}, backend {hw.get('backend')}")
    click.echo(f"hardware: {hw.get('cpu')} ({hw.get('usable_cores')} cores), gcc {hw.get('gcc')}")
    click.echo(f"weights: {len(tensors)} tensors, {sum(t.nbytes for t in tensors.values()) / 1e6:,.1f} MB")
    for name, g in report.get("graphs", {}).items():
        click.echo(f"{name}: {g['kernels']} kernels, {g['kernels_measured']} kernel timings made, "
                   f"search {g['seconds']:.1f} s, peak temporaries {g['peak_bytes'] / 1e6:.2f} MB")
        for r in g["regions"]:
            p = r["progress"]
            click.echo(f"  {r['label']}: {p['tried']} candidates ({p['valid']} valid), best "
                       f"{r['end_to_end_s'] * 1e6:,.0f} us end to end{_gains_text(r)}")


def _gains_text(region: dict) -> str:
    """The winner's gain over the program as lowered: by estimate (the kernels' tuned times
    summed), and timed whole where the compile timed the program as lowered whole too."""
    from .report.page import end_to_end_gain
    p, whole = region["progress"], end_to_end_gain(region)
    estimate = f"{p['first_valid_s'] / p['best_s']:.2f}x by estimate" if p.get("first_valid_s") and p.get("best_s") else ""
    whole = (f"{whole:.2f}x end to end (it ran {region['lowered_end_to_end_s'] * 1e6:,.0f} us under "
             f"{region.get('lowered_variant') or 'the first policy'})" if whole else "")
    gains = "; ".join(g for g in (estimate, whole) if g)
    return f", {gains} over the program as lowered" if gains else ""


@main.command()
@click.argument("folder", type=click.Path())
@click.option("--out", type=click.Path(dir_okay=False),
              help="Where to write the page (default: FOLDER/report.html; for a compile in progress, "
                   "FOLDER.report.html beside it).")
@_clean_errors
def report(folder: str, out: str | None) -> None:
    """Write the compile report of FOLDER (an artifact, or the --out of a compile still running):
    one self-contained HTML page with the search curves, the winner's kernels, e-graph growth,
    rules fired, rejected candidates and the hardware. Prints the page's path."""
    from pathlib import Path
    from .report.page import write_report
    click.echo(str(write_report(Path(folder), Path(out) if out else None)))


if __name__ == "__main__":
    main()
