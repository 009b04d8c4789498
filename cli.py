"""The `kiln` command line. Errors Kiln raises on purpose print as one line and exit non-zero."""
from __future__ import annotations

import functools
import sys

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
    weights, offline), 'minilm', 'llama-3.2-1b' (that shape, random weights), a local
    transformers folder, or 'hf:<Architecture> key=value ...' (random weights from a config).
    """


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
    loaded = catalog.load(model)
    lowered = hf.lower_causal_lm(loaded.model, max_seq=max_seq)
    graph = lowered.decode if decode else lowered.prefill
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
    if len(ids) + max_new_tokens > max_seq:
        raise KilnError(f"kiln: the prompt ({len(ids)} tokens) plus {max_new_tokens} new tokens "
                        f"exceeds --max-seq {max_seq}")
    lowered = hf.lower_causal_lm(loaded.model, max_seq=max_seq)
    new = hf.reference_generate(lowered, ids, max_new_tokens,
                                eos_token_id=loaded.tokenizer.eos_token_id)
    click.echo(prompt + loaded.tokenizer.decode(new, skip_special_tokens=True))


@main.group()
def bench() -> None:
    """Benchmarks: figures printed side by side with their anchors, from one run."""


@bench.command("frontend")
@click.option("--model", "models", multiple=True, default=("smollm2", "llama-3.2-1b"), show_default=True,
              help="MODEL to measure (repeat for several).")
@click.option("--tokens", default=8, show_default=True, help="Decode steps timed per model.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the figures here.")
@_clean_errors
def bench_frontend(models: tuple[str, ...], tokens: int, json_path: str | None) -> None:
    """Export and lowering time, IR node counts, and interpreter time per token."""
    from .frontend.bench import run_frontend_bench
    run_frontend_bench(list(models), tokens, json_path)


if __name__ == "__main__":
    main()
