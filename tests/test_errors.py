"""Bad input gets one clear error that names the problem and what to do."""
import re

import pytest
import torch
from click.testing import CliRunner

import kiln
from kiln.cli import main
from kiln.frontend.registry import LOWERINGS, all_lowerings

TINY_LLAMA = ("hf:LlamaForCausalLM hidden_size=32 intermediate_size=64 num_hidden_layers=1 "
              "num_attention_heads=2 num_key_value_heads=1 vocab_size=64")


class Sorts(torch.nn.Module):
    def forward(self, x):
        return torch.sort(x)[0]


class Hypot(torch.nn.Module):
    def forward(self, x):
        return torch.hypot(x, x)


class Branches(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.export cannot trace it
            return x * 2
        return x


class Scale(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_op_without_lowering_names_op_and_place():
    with pytest.raises(kiln.UnsupportedOp) as err:
        kiln.lower(Hypot(), (torch.randn(3, 4),))
    assert re.fullmatch(r"kiln: cannot lower aten\.hypot \(at root \(Hypot\), test_errors\.py:\d+\); "
                        r"see 'kiln ops'", str(err.value)), str(err.value)


def test_op_refused_on_purpose_says_why():
    with pytest.raises(kiln.UnsupportedOp) as err:
        kiln.lower(Sorts(), (torch.randn(3, 4),))
    assert re.fullmatch(r"kiln: cannot lower aten\.sort \(at root \(Sorts\), test_errors\.py:\d+\): "
                        r"needs sorting, .*; see 'kiln ops'", str(err.value)), str(err.value)


def test_export_failure_is_summarized_with_a_hint():
    with pytest.raises(kiln.ExportError, match=r"torch\.export rejected Branches.*\nhint: .*control flow"):
        kiln.lower(Branches(), (torch.randn(3),))


def test_interpret_checks_count_dtype_and_shape():
    g = kiln.lower(Scale(), (torch.randn(2, 3),))
    with pytest.raises(kiln.KilnTypeError, match=r"takes 1 tensor inputs \(x\), got 2"):
        kiln.interpret(g, torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(kiln.KilnTypeError,
                       match=r"input 0 \('x'\): expected dtype torch.float32, got torch.int64"):
        kiln.interpret(g, torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(kiln.ShapeError, match=r"input 0 \('x'\): expected shape \[2, 3\], got \(3, 2\)"):
        kiln.interpret(g, torch.randn(3, 2))


def test_dynamic_dims_keep_their_names_and_ranges():
    batch = torch.export.Dim("batch", min=2, max=8)
    g = kiln.lower(Scale(), (torch.randn(4, 3),), dynamic_shapes={"x": {0: batch}})
    assert g.symbols == {"batch": (2, 8)}
    with pytest.raises(kiln.ShapeError, match=r"'batch' = 9 is outside its range \[2, 8\]"):
        kiln.interpret(g, torch.randn(9, 3))


def _cli(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("spec, message", [
    ("hf:NoSuchModel", "kiln: transformers has no model class 'NoSuchModel'"),
    ("hf:LlamaForCausalLM hidden", "kiln: expected key=value after the architecture, got 'hidden'"),
    ("gpt-17", "kiln: unknown model 'gpt-17'"),
])
def test_cli_bad_model_is_one_line_and_nonzero(spec, message):
    result = _cli("show", spec)
    assert result.exit_code == 1
    assert result.output.strip().startswith(message) and "Traceback" not in result.output


def test_cli_unlowerable_op_exits_nonzero(monkeypatch):
    """A model using an op with no lowering (rsqrt, with its lowering taken out) fails cleanly."""
    all_lowerings()
    monkeypatch.delitem(LOWERINGS, torch.ops.aten.rsqrt.default)
    result = _cli("show", TINY_LLAMA, "--max-seq", "16")
    assert result.exit_code == 1
    assert re.match(r"kiln: cannot lower aten\.rsqrt \(at .*LlamaRMSNorm.*\); see 'kiln ops'",
                    result.output.strip()), result.output


def test_cli_ops_lists_lowerings_and_refusals():
    result = _cli("ops")
    assert result.exit_code == 0
    assert "aten.mm" in result.output and "SliceUpdate" in result.output
    assert "refused on purpose" in result.output
