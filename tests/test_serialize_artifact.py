"""Graphs round-trip through JSON to the very same nodes; artifact folders are written atomically
and read back with clear errors for anything that is not a whole artifact."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from torch.export import Dim

import kiln
from kiln.frontend import hf
from kiln.ir import DType, Graph, KilnError, Node, Op, run, sym
from kiln.ir.decode import decode_args
from kiln.ir.ops import IOTA_INDEX
from kiln.ir.serialize import GRAPH_FORMAT, _decode, _encode, graph_from_json, graph_to_json, resolve_spec
from kiln.ir.artifact import ARTIFACT_FORMAT, read_artifact, write_artifact

from .helpers import tiny_llama


def through_json(graph: Graph, weights=None) -> Graph:
    text = json.dumps(graph_to_json(graph), allow_nan=False)  # strict JSON: no NaN literals
    return graph_from_json(json.loads(text), weights)


def assert_same_graph(rebuilt: Graph, graph: Graph) -> None:
    assert all(a is b for a, b in zip(rebuilt.outputs, graph.outputs, strict=True))
    assert all(a is b for a, b in zip(rebuilt.inputs, graph.inputs, strict=True))
    assert rebuilt.symbols == graph.symbols
    assert resolve_spec(rebuilt.in_spec) == graph.in_spec and resolve_spec(rebuilt.out_spec) == graph.out_spec


def assert_same_results(rebuilt: Graph, graph: Graph, args: list[np.ndarray]) -> None:
    for got, expected in zip(run(rebuilt, args), run(graph, args), strict=True):
        np.testing.assert_array_equal(got, expected)


# ---- graphs -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lowered_lm():
    return hf.lower_causal_lm(tiny_llama(1), 16)


def test_llama_prefill_round_trips(lowered_lm):
    graph = lowered_lm.prefill
    rebuilt = through_json(graph, graph.weights)
    assert_same_graph(rebuilt, graph)
    ids = np.random.default_rng(0).integers(0, lowered_lm.vocab_size, (1, 7))
    assert_same_results(rebuilt, graph, [ids])


def test_llama_decode_round_trips(lowered_lm):
    graph = lowered_lm.decode
    rebuilt = through_json(graph, graph.weights)
    assert_same_graph(rebuilt, graph)
    rng = np.random.default_rng(1)
    caches = [rng.normal(size=lowered_lm.cache.shape).astype(np.float32)
              for _ in range(2 * lowered_lm.cache.layers)]
    assert_same_results(rebuilt, graph, decode_args(graph, np.array([[5]]), 3, caches))


class StridedConcat(torch.nn.Module):
    """A dynamic width n whose strided slice has (n + 1) // 2 columns, and a dict output."""

    def forward(self, x):
        y = torch.cat([x, x[:, ::2]], dim=1).softmax(-1)
        return {"y": y * -0.0, "positive": x.mean(1) > 0}


def test_dynamic_module_round_trips():
    graph = kiln.lower(StridedConcat(), (torch.randn(3, 10),),
                       dynamic_shapes={"x": {1: Dim("n", min=3, max=64)}})
    assert any("floordiv" in str(n.shape) for n in graph.nodes())
    rebuilt = through_json(graph, graph.weights)
    assert_same_graph(rebuilt, graph)
    for width in (3, 11):
        assert_same_results(rebuilt, graph, [np.random.default_rng(width).normal(size=(3, width))
                                             .astype(np.float32)])


def test_attributes_round_trip_exactly():
    n, m = sym("n"), sym("m")
    # values == would merge but the hash-consing keeps apart, each its own node
    constants = [Node(Op.CONSTANT, value=v, dtype=DType.F32)
                 for v in (0.0, -0.0, math.inf, -math.inf, math.nan, 0.1, 1e-310)]
    constants += [Node(Op.CONSTANT, value=v, dtype=DType.I64) for v in (1, -(2**62))]
    constants += [Node(Op.CONSTANT, value=v, dtype=DType.BOOL) for v in (True, False)]
    expr = (n // 3 + m % 4) * 2 + n.max(m) * n * m + (n // m) // 2 + sym(IOTA_INDEX) * -7
    iotas = [Node(Op.IOTA, expr=expr, length=length, dtype=DType.I32)
             for length in (4, kiln.ir.const(4), n.min(m) + 1)]
    graph = Graph(inputs=[], outputs=constants + iotas, symbols={"n": (1, 9), "m": (2, 5)})
    assert_same_graph(through_json(graph), graph)


@pytest.mark.parametrize("value", [(1, (2.5, (True, "s")), ()), (-0.0, 0, False), (DType.BF16,)])
def test_nested_values_keep_their_types(value):
    decoded = _decode(json.loads(json.dumps(_encode(value, "test"))))
    assert repr(decoded) == repr(value)
    assert [type(v) for v in decoded] == [type(v) for v in value]


def test_unknown_attribute_types_are_refused():
    with pytest.raises(KilnError, match="cannot serialize attribute x"):
        _encode(np.float32(1.0), "x")


def test_weights_are_checked_when_attached(lowered_lm):
    graph = lowered_lm.decode
    data = json.loads(json.dumps(graph_to_json(graph)))
    assert graph_from_json(data).weights == {}
    name = next(iter(graph.weights))
    with pytest.raises(KilnError, match=f"weight '{name}'.*lack"):
        graph_from_json(data, {k: v for k, v in graph.weights.items() if k != name})
    with pytest.raises(KilnError, match=f"weight '{name}' is float64"):
        graph_from_json(data, {**graph.weights, name: graph.weights[name].astype(np.float64)})


def small_graph_json() -> dict:
    x = Node(Op.INPUT, name="x", role="input", shape=(kiln.ir.const(2),), dtype=DType.F32)
    return graph_to_json(Graph(inputs=[x], outputs=[Node(Op.SQRT, [x])]))


@pytest.mark.parametrize("corrupt, words", [
    (lambda d: d.update(format=GRAPH_FORMAT + 1), "format 2, this Kiln reads format 1"),
    (lambda d: d.pop("format"), "malformed"),
    (lambda d: d.pop("outputs"), "malformed"),
    (lambda d: d["nodes"][1].update(op="Cbrt"), "malformed"),
    (lambda d: d["nodes"][1].update(inputs=[1]), "index 1"),
    (lambda d: d["nodes"][1].update(inputs=[-1]), "index -1"),
    (lambda d: d["nodes"][1].update(inputs=[0, 0]), "malformed"),
    (lambda d: d.update(outputs=[5]), "index 5"),
    (lambda d: d["nodes"][0]["attrs"].update(dtype={"dtype": "f128"}), "malformed"),
    (lambda d: d["nodes"][0]["attrs"].update(dtype="f32"), "malformed"),
    (lambda d: d["nodes"][0]["attrs"].update(shape=[{"expr": [[[{"call": "pow", "args": []}], 1]]}]),
     "malformed"),
    (lambda d: d["nodes"][0]["attrs"].update(shape=[{"float": 2.0}]), "not an encoded attribute"),
    (lambda d: d.update(symbols={"n": [1, "9"]}), "malformed"),
    (lambda d: d.update(in_spec="not a spec"), "malformed"),
])
def test_malformed_graph_json_is_refused(corrupt, words):
    data = small_graph_json()
    graph_from_json(data)  # the uncorrupted data loads
    corrupt(data)
    with pytest.raises(KilnError, match=words):
        graph_from_json(data)


def test_non_object_graph_json_is_refused():
    with pytest.raises(KilnError, match="malformed"):
        graph_from_json([1, 2])


# ---- artifacts ----------------------------------------------------------------------------------

TENSORS = {
    "bf16": np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16),
    "f16": np.array(-0.5, np.float16),
    "transposed": np.arange(6).reshape(2, 3).T,
    "mask": np.array([True, False]),
}


def assert_tensors_equal(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name, array in expected.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array)


def test_artifact_round_trips(tmp_path):
    folder = tmp_path / "out"
    write_artifact(folder, {"manifest.json": json.dumps({"model": "tiny"}), "graph.json": "{}",
                            "kernels/k0.c": b"\x00int k;"}, TENSORS)
    manifest, open_file, tensors = read_artifact(folder)
    assert {k: v for k, v in manifest.items() if k not in ("files", "sha256")} == \
        {"model": "tiny", "format": ARTIFACT_FORMAT}
    assert set(manifest["files"]) == {"graph.json", "kernels/k0.c", "weights.safetensors"}
    assert open_file("graph.json") == b"{}" and open_file("kernels/k0.c") == b"\x00int k;"
    assert_tensors_equal(tensors, TENSORS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_loaded_tensors_are_writable_and_start_on_cache_lines(tmp_path):
    """Kernels read weights with vector loads; the loader places them itself (on huge pages)."""
    tensors = {**TENSORS, "empty": np.zeros((0, 3), np.float32), "odd": np.arange(7, dtype=np.int8)}
    write_artifact(tmp_path / "out", {}, tensors)
    _, _, loaded = read_artifact(tmp_path / "out")
    assert_tensors_equal(loaded, tensors)
    for name, array in loaded.items():
        assert array.ctypes.data % 64 == 0 and array.flags.writeable and array.flags.c_contiguous, name


def test_artifact_without_manifest_or_tensors(tmp_path):
    write_artifact(tmp_path / "out", {}, None)
    manifest, _, tensors = read_artifact(tmp_path / "out")
    assert manifest["format"] == ARTIFACT_FORMAT and list(manifest["files"]) == ["weights.safetensors"]
    assert tensors == {}


def test_graph_travels_in_an_artifact(tmp_path, lowered_lm):
    graph = lowered_lm.prefill
    write_artifact(tmp_path / "lm", {"prefill.json": json.dumps(graph_to_json(graph))}, graph.weights)
    _, open_file, tensors = read_artifact(tmp_path / "lm")
    rebuilt = graph_from_json(json.loads(open_file("prefill.json")), tensors)
    assert_same_results(rebuilt, graph, [np.array([[1, 2, 3]])])


def test_rewriting_replaces_the_previous_artifact(tmp_path):
    folder = tmp_path / "out"
    write_artifact(folder, {"old.txt": "old"}, {"w": np.zeros(3)})
    write_artifact(folder, {"new.txt": "new"}, {"w": np.ones(2)})
    _, open_file, tensors = read_artifact(folder)
    assert open_file("new.txt") == b"new" and not (folder / "old.txt").exists()
    assert_tensors_equal(tensors, {"w": np.ones(2)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_empty_folder_becomes_an_artifact(tmp_path):
    (tmp_path / "out").mkdir()
    write_artifact(tmp_path / "out", {"a": "b"}, None)
    assert read_artifact(tmp_path / "out")[1]("a") == b"b"


@pytest.mark.parametrize("make", [lambda p: (p.mkdir(), (p / "notes.txt").write_text("mine")),
                                  lambda p: p.write_text("a file")])
def test_refuses_to_overwrite_what_is_not_an_artifact(tmp_path, make):
    folder = tmp_path / "out"
    make(folder)
    before = sorted(folder.rglob("*")) if folder.is_dir() else folder.read_text()
    with pytest.raises(KilnError, match=f"kiln: {folder} exists and is not a Kiln artifact; "
                                        "choose another --out"):
        write_artifact(folder, {"a": "b"}, None)
    assert (sorted(folder.rglob("*")) if folder.is_dir() else folder.read_text()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_write_leaves_nothing_half_written(tmp_path, existing):
    folder = tmp_path / "out"
    if existing:
        write_artifact(folder, {"old.txt": "old"}, {"w": np.zeros(3)})
    # the files are written, then safetensors rejects a dtype it has no code for
    with pytest.raises(KilnError, match="cannot write"):
        write_artifact(folder, {"new.txt": "new"}, {"w": np.ones(2), "text": np.array(["no"])})
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out"] if existing else [])
    if existing:
        _, open_file, tensors = read_artifact(folder)
        assert open_file("old.txt") == b"old" and not (folder / "new.txt").exists()
        assert_tensors_equal(tensors, {"w": np.zeros(3)})


def test_unwritable_parent_names_the_folder(tmp_path):
    (tmp_path / "file").write_text("")
    folder = tmp_path / "file" / "out"
    with pytest.raises(KilnError, match=f"cannot write {folder}"):
        write_artifact(folder, {}, None)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_parent_names_the_folder(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o555)
    with pytest.raises(KilnError, match=f"cannot write {parent / 'out'}"):
        write_artifact(parent / "out", {}, None)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_folder_no_file_can_be_made_in_is_refused_before_the_work():
    """os.access says yes to root everywhere; a file made and removed tells the truth."""
    from kiln.ir.artifact import check_writable
    with pytest.raises(KilnError, match="cannot write /proc/forbidden"):
        check_writable(Path("/proc/forbidden"))


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "weights.safetensors"])
def test_file_names_stay_inside_the_artifact(tmp_path, name):
    with pytest.raises(KilnError, match="not a file name"):
        write_artifact(tmp_path / "out", {name: "x"}, None)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def artifact(tmp_path):
    write_artifact(tmp_path / "out", {"manifest.json": '{"model": "m"}', "a.txt": "a"}, TENSORS)
    return tmp_path / "out"


@pytest.mark.parametrize("damage, words", [
    (lambda f: (f / "manifest.json").unlink(), "is not a Kiln artifact"),
    (lambda f: (f / "manifest.json").write_text("{not json"), "is corrupted: manifest.json"),
    (lambda f: (f / "manifest.json").write_text("[1]"), "is corrupted: manifest.json has no format"),
    (lambda f: (f / "manifest.json").write_text('{"format": 99}'), "has format 99, this Kiln reads"),
    (lambda f: (f / "weights.safetensors").unlink(), "altered after it was written: weights.safetensors cannot"),
    (lambda f: (f / "weights.safetensors").write_bytes(b"\x08" + bytes(20)),
     "altered after it was written: weights.safetensors does not match"),
    (lambda f: (f / "a.txt").write_text("b"), "altered after it was written: a.txt does not match"),
    (lambda f: (f / "manifest.json").write_text((f / "manifest.json").read_text().replace('"m"', '"n"')),
     "altered after it was written: manifest.json does not match its own checksum"),
])
def test_damaged_artifacts_are_refused(artifact, damage, words):
    read_artifact(artifact)  # whole before the damage
    damage(artifact)
    with pytest.raises(KilnError, match=words):
        read_artifact(artifact)


def test_reading_what_is_not_a_folder(tmp_path):
    with pytest.raises(KilnError, match="is not a folder"):
        read_artifact(tmp_path / "missing")
    (tmp_path / "file").write_text("")
    with pytest.raises(KilnError, match="is not a folder"):
        read_artifact(tmp_path / "file")


def test_open_file_errors(artifact):
    _, open_file, _ = read_artifact(artifact)
    with pytest.raises(KilnError, match="corrupted: cannot read b.txt"):
        open_file("b.txt")
    with pytest.raises(KilnError, match="not a file name"):
        open_file("../out/a.txt")


def test_bf16_weights_read_back_in_a_fresh_process(tmp_path):
    """ml_dtypes (bf16's numpy type) is imported only when asked for: a process that reads a bf16
    artifact first thing must still read its weights (a fresh `kiln generate` once could not)."""
    import subprocess
    import sys
    bf16 = DType.BF16.np
    write_artifact(tmp_path / "out", {"manifest.json": json.dumps({"model": "tiny"})},
                   {"w": np.arange(6, dtype=np.float32).astype(bf16).reshape(2, 3)})
    code = ("import sys\nfrom kiln.ir.artifact import read_artifact\n"
            "_, _, tensors = read_artifact(sys.argv[1])\n"
            "print(tensors['w'].dtype, tensors['w'].astype('float32').ravel().tolist())\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-1000:]
    assert out.stdout.split() == ["bfloat16", "[0.0,", "1.0,", "2.0,", "3.0,", "4.0,", "5.0]"]
