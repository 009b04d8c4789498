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
