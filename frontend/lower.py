"""torch.export -> core ATen -> Kiln IR, and `interpret` to run the result on torch tensors."""
from __future__ import annotations

import functools
import inspect
import operator
import re
from typing import Any

import sympy
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree
from torch.utils._sympy.numbers import int_oo

from ..ir import DType, Expr, ExportError, Graph, KilnTypeError, Node, Op, UnsupportedOp, build, run
from ..ir.serialize import resolve_spec
from ..ir.symbolic import prod
from .lowerings.complex_pairs import Complex, lower_complex
from .registry import UNSUPPORTED, LowerCtx, all_lowerings
from ..ir.tensors import from_numpy, kiln_dtype, to_numpy, torch_dtype
from .symbols import to_expr

# graph nodes that only assert or annotate: nothing to compute
_IGNORED = {
    torch.ops.aten._assert_tensor_metadata.default, torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default, torch.ops.aten.sym_constrain_range.default,
    torch.ops.aten._assert_async.msg,
}
_SYM_OPS = {operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
            operator.floordiv: operator.floordiv, operator.mod: operator.mod, operator.neg: operator.neg}


def export(module: torch.nn.Module, args: tuple, kwargs: dict | None = None,
           dynamic_shapes=None) -> ExportedProgram:
    """torch.export then the core-ATen decompositions; an export failure becomes an ExportError."""
    try:
        ep = torch.export.export(module, tuple(args), kwargs=kwargs, dynamic_shapes=dynamic_shapes)
        # decomposing can hit a data-dependent size too (e.g. take's index bounds)
        return ep.run_decompositions()
    except Exception as err:  # torch raises many types here; all mean "cannot export"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ExportError(
            f"kiln: torch.export rejected {type(module).__name__}: {type(err).__name__}: {first}\n"
            "hint: Kiln needs a module torch.export can trace — no data-dependent Python control "
            "flow, no .item()/.tolist(), tensors or nested tuples/dicts of tensors as inputs; "
            "for a changing size pass dynamic_shapes as torch.export documents") from err


def lower(module: torch.nn.Module, args: tuple, dynamic_shapes=None, kwargs: dict | None = None) -> Graph:
    """Lower any module torch.export accepts to a Kiln graph (same dynamic_shapes convention)."""
    ep = export(module, args, kwargs, dynamic_shapes)
    names = _dim_names(module, args, dynamic_shapes, ep)
    return lower_exported(ep, names)


def lower_exported(ep: ExportedProgram, symbol_names: dict[str, str] | None = None) -> Graph:
    names = symbol_names or {}
    lowerings = all_lowerings()
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    env: dict[str, Any] = {}
    inputs, weights = [], {}
    outputs: list[Any] = []
    for fx in ep.graph.nodes:
        if fx.op == "placeholder":
            spec = specs.get(fx.name)
            val = fx.meta.get("val")
            if not isinstance(val, torch.Tensor):
                env[fx.name] = to_expr(val, names) if isinstance(val, (int, torch.SymInt)) else val
                continue
            shape = tuple(to_expr(d, names) for d in val.shape)
            dtype = kiln_dtype(val.dtype)
            if spec is not None and spec.kind != InputKind.USER_INPUT:
                tensor = ep.state_dict.get(spec.target)
                tensor = ep.constants[spec.target] if tensor is None else tensor
                weights[spec.target] = to_numpy(tensor, dtype)
                env[fx.name] = Node(Op.INPUT, name=spec.target, role="weight", shape=shape, dtype=dtype)
            else:
                node = Node(Op.INPUT, name=fx.name, role="input", shape=shape, dtype=dtype)
                inputs.append(node)
                env[fx.name] = node
        elif fx.op == "call_function":
            env[fx.name] = _lower_call(fx, env, lowerings, names)
        elif fx.op == "output":
            outputs = [_as_node(_resolve(a, env)) for a in _user_outputs(ep, fx)]
    symbols = {names.get(str(s), str(s)): (_bound(r.lower), _bound(r.upper))
               for s, r in ep.range_constraints.items() if str(s).isidentifier()}
    return Graph(inputs=inputs, outputs=outputs, weights=weights, symbols=symbols,
                 out_spec=ep.call_spec.out_spec, in_spec=ep.call_spec.in_spec)


def _user_outputs(ep: ExportedProgram, fx: torch.fx.Node) -> list:
    """The module's own outputs, which out_spec describes: torch.export puts the new values of
    inputs and buffers updated in place (batch norm's running statistics) before them."""
    leaves = list(fx.args[0])
    kinds = [s.kind for s in ep.graph_signature.output_specs]
    if len(kinds) != len(leaves):
        return pytree.tree_leaves(fx.args[0])
    return pytree.tree_leaves([a for a, kind in zip(leaves, kinds) if kind == OutputKind.USER_OUTPUT])


def _bound(value) -> int:
    """A range end as an int; torch's unbounded ends (int_oo, oo) become the int32 limit."""
    if value in (int_oo, sympy.oo):
        return 2**31 - 1
    if value in (-int_oo, -sympy.oo):
        return 0
    return int(value)


def _lower_call(fx: torch.fx.Node, env: dict, lowerings: dict, names: dict) -> Any:
    target = fx.target
    args = [_resolve(a, env) for a in fx.args]
    kwargs = {k: _resolve(v, env) for k, v in fx.kwargs.items()}
    if target in _IGNORED:
        return None
    if target is operator.getitem:
        return args[0][args[1]]
    if target in _SYM_OPS:
        return _SYM_OPS[target](*[Expr.of(a) if isinstance(a, int) else a for a in args])
    if target is torch.ops.aten.sym_size.int:
        return args[0].shape[args[1]]
    if target is torch.ops.aten.sym_numel.default:
        return prod(args[0].shape)
    lowering = lowerings.get(target)
    if any(isinstance(a, Complex) for a in pytree.tree_leaves((args, kwargs))):
        lowering = functools.partial(lower_complex, target, lowerings=lowerings)
    elif lowering is None:
        raise UnsupportedOp(_unsupported_message(fx))
    try:
        return lowering(LowerCtx(fx, names), *args, **kwargs)
    except UnsupportedOp as err:
        raise UnsupportedOp(f"{err} ({_where(fx)})") from None


def _resolve(a, env):
    if isinstance(a, torch.fx.Node):
        return env[a.name]
    if isinstance(a, (list, tuple)):
        return type(a)(_resolve(x, env) for x in a)
    return a


def _as_node(value) -> Node:
    if isinstance(value, Node):
        return value
    if isinstance(value, Expr):
        return build.scalar_of(value)
    if isinstance(value, (bool, int, float)):
        return build.constant(value, DType.BOOL if isinstance(value, bool) else
                              DType.I64 if isinstance(value, int) else DType.F32)
    raise UnsupportedOp(f"kiln: a module output of type {type(value).__name__} is not a tensor")


def op_name(target) -> str:
    return str(target).replace("aten.", "", 1).split(".")[0]


def _where(fx: torch.fx.Node) -> str:
    stack = fx.meta.get("nn_module_stack") or {}
    module = ""
    if stack:
        path, cls = list(stack.values())[-1]
        module = f"{path or 'root'} ({getattr(cls, '__name__', str(cls).split('.')[-1])})"
    frames = re.findall(r'File "([^"]+)", line (\d+)', fx.meta.get("stack_trace") or "")
    line = f"{frames[-1][0].split('/')[-1]}:{frames[-1][1]}" if frames else ""
    return "at " + ", ".join(p for p in (module, line) if p) if (module or line) else "at an unknown place"


def _unsupported_message(fx: torch.fx.Node) -> str:
    reason = UNSUPPORTED.get(fx.target)
    why = f": {reason}" if reason else ""
    return f"kiln: cannot lower aten.{op_name(fx.target)} ({_where(fx)}){why}; see 'kiln ops'"


def _dim_names(module, args, dynamic_shapes, ep: ExportedProgram) -> dict[str, str]:
    """Map torch's symbols (s0, s27, ...) to the names of the user's torch.export.Dim objects."""
    if not dynamic_shapes:
        return {}
    if isinstance(dynamic_shapes, dict):
        params = list(inspect.signature(module.forward).parameters)
        per_arg = [dynamic_shapes.get(p) for p in params[:len(args)]]
    else:
        per_arg = list(dynamic_shapes)
    user = [n for n in ep.graph.nodes if n.op == "placeholder"
            and _is_user_input(ep, n.name)]
    names: dict[str, str] = {}
    for fx, spec, arg in zip(user, per_arg, args):
        if not isinstance(arg, torch.Tensor) or spec is None:
            continue
        items = spec.items() if isinstance(spec, dict) else enumerate(spec)
        for axis, dim in items:
            size = fx.meta["val"].shape[axis]
            name = getattr(dim, "__name__", None)
            if isinstance(size, torch.SymInt) and name and str(size.node.expr).isidentifier():
                names[str(size.node.expr)] = name
    return names


def _is_user_input(ep: ExportedProgram, name: str) -> bool:
    return any(s.kind == InputKind.USER_INPUT and getattr(s.arg, "name", None) == name
               for s in ep.graph_signature.input_specs)


def interpret(graph: Graph, *args, **kwargs) -> Any:
    """Run a lowered graph with the reference interpreter; outputs as torch tensors, structured
    as the module returns them."""
    leaves = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
    if len(leaves) != len(graph.inputs):
        raise KilnTypeError(f"the graph takes {len(graph.inputs)} tensor inputs "
                            f"({', '.join(n.attrs['name'] for n in graph.inputs)}), got {len(leaves)}")
    for i, (node, leaf) in enumerate(zip(graph.inputs, leaves)):
        if kiln_dtype(leaf.dtype) is not node.dtype:
            raise KilnTypeError(f"input {i} ('{node.attrs['name']}'): expected dtype "
                                f"{torch_dtype(node.dtype)}, got {leaf.dtype}")
    outs = [from_numpy(o) for o in run(graph, [to_numpy(t) for t in leaves])]
    spec = resolve_spec(graph.out_spec)
    return pytree.tree_unflatten(outs, spec) if spec is not None else outs
