"""`kiln chart`: the PNG of a GPU bench result, drawn where matplotlib is installed."""
from __future__ import annotations

import json

from click.testing import CliRunner

from kiln.cli import main


def test_chart_of_a_bench_result_is_a_png(tmp_path):
    result = {"model": "llama-3.2-1b", "dtype": "bfloat16", "gpu": "NVIDIA H200", "prefill_tokens": 512,
              "bandwidth_bound_tokens_per_s": 1500.0,
              "eager_decode_tokens_per_s": 120.0, "eager_prefill_tokens_per_s": 9000.0,
              "torch_compile_decode_tokens_per_s": 550.0, "torch_compile_prefill_tokens_per_s": 20000.0,
              "kiln_decode_tokens_per_s": 300.0, "kiln_prefill_tokens_per_s": 4000.0}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result))
    out = CliRunner().invoke(main, ["chart", str(path)])
    assert out.exit_code == 0, out.output
    png = (tmp_path / "bench.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_chart_of_something_else_says_what_it_needs(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"model": "x"}))
    out = CliRunner().invoke(main, ["chart", str(path)])
    assert out.exit_code != 0
    assert "is not a bench JSON written by `kiln bench gpu`" in out.output


def test_chart_of_a_bench_cut_short_draws_what_it_measured(tmp_path, monkeypatch):
    """A bench stopped before its end (a device call's time limit) wrote its JSON figure by
    figure: no bound yet, no torch.compile prefill. The chart draws the bound from the copy rate
    and the weights, and says which figure was not measured instead of drawing a zero."""
    from kiln.bench.gpu import _chart
    result = {"model": "llama-3.2-1b", "dtype": "bfloat16", "gpu": "NVIDIA H200", "prefill_tokens": 512,
              "copy_bytes_per_s": 4.2e12, "weight_bytes": 2.47e9,
              "eager_decode_tokens_per_s": 32.0, "eager_prefill_tokens_per_s": 27000.0,
              "torch_compile_decode_tokens_per_s": 314.0,
              "kiln_decode_tokens_per_s": 778.0, "kiln_prefill_tokens_per_s": 6352.0}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result))
    out = CliRunner().invoke(main, ["chart", str(path)])
    assert out.exit_code == 0, out.output
    import matplotlib.figure
    texts, savefig = [], matplotlib.figure.Figure.savefig

    def keep_texts(fig, *args, **kwargs):
        texts.extend(t.get_text() for ax in fig.axes for t in ax.texts)
        return savefig(fig, *args, **kwargs)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep_texts)
    _chart(result, str(tmp_path / "again.png"))
    assert "not measured" in texts and "bandwidth bound" in texts and "0" not in texts


def test_the_bound_counts_the_bytes_a_decode_token_reads():
    """A dense model whose head shares the embedding reads every weight a token; a mixture of
    experts reads its chosen experts' share of the expert parameters and one row of an input
    embedding its head does not share. Counted by hand on the named 1B MoE (on the meta device:
    no memory) and on a tiny tied Llama."""
    import torch
    from kiln.bench.gpu import active_weight_bytes
    from kiln.frontend.catalog import NAMED_CONFIGS, from_config
    from tests.helpers import tiny_llama
    dense = tiny_llama(1, tie_word_embeddings=True)
    assert active_weight_bytes(dense) == sum(p.numel() * 4 for p in dense.parameters())
    arch, config = NAMED_CONFIGS["qwen3-moe-1b"]
    with torch.device("meta"):
        moe = from_config(arch, config).to(torch.bfloat16)
    hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    experts = layers * config["num_experts"] * 3 * hidden * config["moe_intermediate_size"]
    total = sum(p.numel() for p in moe.parameters())
    assert 1.1e9 < total < 1.2e9 and experts == sum(p.numel() for n, p in moe.named_parameters() if "experts" in n)
    # one embedding row, the chosen 4 of 64 experts, everything else
    want = total - vocab * hidden + hidden - experts + experts * 4 // 64
    assert active_weight_bytes(moe) == 2 * want
    assert 2.4e8 < want < 2.6e8
