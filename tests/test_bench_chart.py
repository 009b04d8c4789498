"""`kiln bench chart`: the PNG of a GPU bench result, drawn where matplotlib is installed."""
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
    out = CliRunner().invoke(main, ["bench", "chart", str(path)])
    assert out.exit_code == 0, out.output
    png = (tmp_path / "bench.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_chart_of_something_else_says_what_it_needs(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"model": "x"}))
    out = CliRunner().invoke(main, ["bench", "chart", str(path)])
    assert out.exit_code != 0
    assert "is not a bench JSON written by `kiln bench gpu`" in out.output
