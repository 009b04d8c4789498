"""Fused attention: a kernel whose value is softmax(QKᵀ)V, every piece inlined (the scheduler's
attention merge), runs as one pass over the keys per query row with an online softmax, instead of
as the loop nest it reads as (which would compute every score once per output element).

`as_attention` recognizes the value in the kernel IR, strictly:

    out[rows, d] = [cast] Σ_j P(j) · v(j, d)
    P(j)         = [where(G, fill,] E(j) · recip(Σ_j' E(j'))[)]
                   or, normalized after the product (the rule softmax-normalize-after-pv):
    out[rows, d] = [cast] (Σ_j [where(G, 0,] E(j)[)] · v(j, d)) · [where(G, 0,] recip(Σ_j' E(j'))[)]
    E(j)         = exp2((X(j) - max_j' X(j')) · L),  L > 0
    X(j)         = any elementwise expression of S(j) and loads over (rows, j)
    S(j)         = Σ_k q(rows, k) · k(rows, j, k),  each operand an f16/bf16 load, maybe scaled
                   (f32 too where q has no query row: decode)

G is any condition on the row built from reductions over j of elementwise functions of X (the
fully-masked-row guard of scaled_dot_product_attention): each is accumulated in the same pass.

The online form follows from two identities, applied tile by tile of keys: for the running
maximum m and a new one m', exp2((x - m')L) = exp2((x - m)L) · exp2((m - m')L), so the running
sum of E and the running Σ E·v are rescaled by the second factor when the maximum grows; and
Σ_j E(j)·recip(l)·v(j) = recip(l) · Σ_j E(j)·v(j), so the division happens once, at the end. A
key whose X is -inf (masked) adds nothing to either; where X = A(S) + B with B free of S, a run of
keys whose B is -inf for every row of a tile is skipped without computing S (only the guards
still see those keys, evaluated at S = 0: X is -inf at any finite S). Where moreover A(S) = c·S,
the tensor-core pass also skips keys whose B is finite but too low to matter (cuda_attention.py's
FAINT).

Both emitters (C here, CUDA tensor cores in cuda_attention.py) render the pointwise pieces (X,
the guards' bodies, G) with the C body renderer, so whatever elementwise expression the model
uses is computed as the interpreter computes it."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..ir.dtypes import DType
from ..ir.ops import Op
from ..ir.symbolic import Expr
from .c_emit import (COMPUTE, STORAGE, KernelConfig, _Body, index_code, literal, load_code,
                     reduction_accumulator, store_code)
from .index import stride
from .kernel import Apply, Const, Kernel, Load, Reduce, Scalar, free_vars, nodes, rebuilt, renamed

KEY = "kiln_j"          # the key position, in every piece after renaming
DEPTH = "kiln_k"        # the head dimension the scores sum over
SCORE = "kiln_s"        # the C variable holding S(j)
_HALF = (DType.BF16, DType.F16)
_FLOAT = (*_HALF, DType.F32)


@dataclass(frozen=True)
class AttentionConfig:
    """Run the kernel as fused attention: `rows` query rows per block (16 per warp on the GPU),
    keys in tiles of `keys`."""
    rows: int = 64
    keys: int = 64

    def key(self) -> str:
        return f"attention-r{self.rows}-k{self.keys}"

    def to_json(self) -> dict:
        return {"attention": {"rows": self.rows, "keys": self.keys}}

    @staticmethod
    def from_json(data: dict) -> AttentionConfig:
        return AttentionConfig(int(data["attention"]["rows"]), int(data["attention"]["keys"]))


@dataclass(frozen=True)
class Operand:
    """A 16-bit load read along one variable with stride 1, times a constant."""
    load: Load
    scale: float


@dataclass(frozen=True)
class Attention:
    kernel: Kernel
    query: str | None               # the output loop over query positions (a tile's rows); None:
                                    # one query a batch point (decode: its query heads' keys and
                                    # values differ, or are shared by a group of heads)
    batch: tuple[str, ...]          # the other output loops but d (heads): one tile each
    d: str                          # the output loop over the value's dimension
    keys: Expr                      # the number of keys
    depth: int                      # the length of the scores' sum
    q: Operand                      # over the rows and DEPTH
    k: Operand                      # over the rows, KEY and DEPTH
    v: Load                         # over the rows, KEY and d
    score: Reduce                   # S, its variables KEY and DEPTH
    logit: Scalar                   # X
    masked_part: Scalar | None      # B, where X = A(S) + B and B does not read S
    score_factor: float | None      # c, where moreover A(S) = c·S
    exponent: float                 # L
    guards: tuple[Reduce, ...]      # G's reductions over KEY
    guard: Scalar | None            # G
    fill: Scalar | None             # P's value where G holds
    cast: DType | None              # the output's rounding, when the value ends in a cast

    @property
    def dtype(self) -> DType:
        return self.q.load.dtype


@functools.lru_cache(maxsize=1024)
def as_attention(kernel: Kernel) -> Attention | None:
    try:
        return _match(kernel)
    except _NoMatch:
        return None


class _NoMatch(Exception):
    pass


def _need(condition) -> None:
    if not condition:
        raise _NoMatch


def _match(kernel: Kernel) -> Attention:
    _need(not kernel.also and kernel.output.dtype.is_float and len(kernel.loops) >= 2)
    value, cast = kernel.value, None
    if isinstance(value, Apply) and value.op is Op.CAST:
        value, cast = value.args[0], value.dtype
    row_factor = None       # normalized after the product: (Σ_j E(j)·v) · recip(Σ_j E(j))
    if isinstance(value, Apply) and value.op is Op.MUL:
        value, row_factor = _pick(value.args, lambda x: isinstance(x, Reduce))
    _need(isinstance(value, Reduce) and value.op is Op.SUM_REDUCE and isinstance(value.body, Apply)
          and value.body.op is Op.MUL and value.dtype is DType.F32)
    keys = value.extent
    body = renamed(value.body, {value.var: KEY})
    loops = [v for v, _ in kernel.loops]
    memo: dict = {}
    v_term, p = _pick(body.args, lambda x: _float_load(x) is not None)
    d_vars = [v for v in loops if v in free_vars(v_term, memo) and v not in free_vars(p, memo)]
    _need(len(d_vars) == 1)
    d = d_vars[0]
    v = _operand_load(v_term)
    _need(stride(v.index, d) == 1)
    rows = [x for x in loops if x != d]
    _need(not free_vars(p, memo) - set(rows) - {KEY} - set(kernel.symbols))

    guard = fill = None
    if isinstance(p, Apply) and p.op is Op.WHERE:
        guard, fill, p = p.args
        _need(isinstance(fill, Const) and guard.dtype is DType.BOOL)
    if row_factor is None:
        _need(isinstance(p, Apply) and p.op is Op.MUL)
        denominator, e = _pick(p.args, lambda x: isinstance(x, Apply) and x.op is Op.RECIP)
    else:
        denominator, e = _normalized_after(row_factor, guard, fill, memo, rows, kernel.symbols), p
    _need(isinstance(denominator, Apply) and denominator.op is Op.RECIP)
    total = denominator.args[0]
    _need(isinstance(total, Reduce) and total.op is Op.SUM_REDUCE and total.extent == keys
          and _same(renamed(total.body, {total.var: KEY}), e))
    logit, maximum, exponent = _exponential(e, keys)
    score = _only_score(logit)
    logit = canonical(logit, score)
    depth = score.extent
    _need(depth.is_const and depth.value % 16 == 0 and 16 <= depth.value <= 256)
    q_side, k_side = _pick(score.body.args, lambda x: KEY not in free_vars(x, memo))
    q, k = _operand(q_side, DEPTH), _operand(k_side, DEPTH)
    _need(q.load.dtype == k.load.dtype == v.dtype)
    queries = [x for x in rows if x in free_vars(q.load, memo) and x not in free_vars(k.load, memo)]
    query = queries[-1] if queries else None
    # prefill's tensor-core pass takes 16-bit operands; one query a point (decode), both
    # backends' passes read f32 too
    _need(q.load.dtype in _HALF or query is None)
    guards = _guards(guard, keys, score) if guard is not None else ()
    return Attention(kernel, query, tuple(x for x in rows if x != query), d, keys, depth.value, q, k,
                     v, score, logit, *_masked_part(logit, score), exponent, guards, guard, fill, cast)


def _normalized_after(factor: Scalar, guard: Scalar | None, fill: Scalar | None, memo: dict, rows,
                      symbols) -> Scalar:
    """The row factor of softmax normalized after P·V (the rule softmax-normalize-after-pv): per
    row, and guarded as the weights are, with zeros on both sides (so that (Σ 0·v)·0 is the fill)."""
    _need(not free_vars(factor, memo) - set(rows) - set(symbols))
    if guard is None:
        return factor
    _need(isinstance(factor, Apply) and factor.op is Op.WHERE and _same(factor.args[0], guard)
          and factor.args[1] == fill and float(fill.value) == 0.0)
    return factor.args[2]


def _pick(pair, test) -> tuple[Scalar, Scalar]:
    """(the one of two arguments passing `test`, the other); exactly one must."""
    a, b = pair
    _need(test(a) != test(b))
    return (a, b) if test(a) else (b, a)


def _float_load(x: Scalar) -> Load | None:
    """The f16/bf16 load x reads, widened to f32 or not; or the f32 load it is."""
    if isinstance(x, Apply) and x.op is Op.CAST and x.dtype is DType.F32:
        x = x.args[0]
    return x if isinstance(x, Load) and x.dtype in _FLOAT else None


def _operand_load(x: Scalar) -> Load:
    load = _float_load(x)
    _need(load is not None)
    return load


def _operand(x: Scalar, var: str) -> Operand:
    scale = 1.0
    if isinstance(x, Apply) and x.op is Op.MUL and x.dtype is DType.F32:
        constant, x = _pick(x.args, lambda a: isinstance(a, Const))
        scale = float(constant.value)
    load = _operand_load(x)
    _need(stride(load.index, var) == 1)
    return Operand(load, scale)


def _exponential(e: Scalar, keys: Expr) -> tuple[Scalar, Reduce, float]:
    """E = exp2((X + max·(-1)) · L): (X, the max, L)."""
    _need(isinstance(e, Apply) and e.op is Op.EXP2)
    inner = e.args[0]
    _need(isinstance(inner, Apply) and inner.op is Op.MUL)
    exponent, shifted = _pick(inner.args, lambda a: isinstance(a, Const))
    _need(float(exponent.value) > 0 and isinstance(shifted, Apply) and shifted.op is Op.ADD)
    negated, logit = _pick(shifted.args, lambda a: isinstance(a, Apply) and a.op is Op.MUL
                           and any(isinstance(b, Const) and b.value == -1 for b in a.args))
    _, maximum = _pick(negated.args, lambda a: isinstance(a, Const))
    _need(isinstance(maximum, Reduce) and maximum.op is Op.MAX_REDUCE and maximum.extent == keys
          and _same(renamed(maximum.body, {maximum.var: KEY}), logit))
    return logit, maximum, float(exponent.value)


def _same(a: Scalar, b: Scalar) -> bool:
    """Equal up to the names of their reductions' variables (each copy of the score has its own)."""
    return _levels(a) == _levels(b)


def _levels(x: Scalar) -> Scalar:
    """x with each reduction's variable named by how many reductions enclose it."""
    memo: dict = {}

    def go(s: Scalar, level: int) -> Scalar:
        if (s, level) in memo:
            return memo[s, level]
        if isinstance(s, Reduce):
            name = f"kiln_r{level}"
            out = Reduce(s.op, name, s.extent, go(renamed(s.body, {s.var: name}), level + 1), s.dtype)
        elif isinstance(s, Apply):
            out = Apply(s.op, tuple(go(a, level) for a in s.args), s.dtype)
        else:
            out = s
        memo[s, level] = out
        return out
    return go(x, 0)


def _reductions(x: Scalar) -> list[Reduce]:
    """x's outermost reductions."""
    return [s for s in nodes(x, enter=lambda s: not isinstance(s, Reduce)) if isinstance(s, Reduce)]


def _only_score(logit: Scalar) -> Reduce:
    """X's one reduction, S = Σ_k a·b over a constant extent, its variable renamed DEPTH."""
    found = _reductions(logit)
    _need(len(found) == 1)
    score = found[0]
    _need(score.op is Op.SUM_REDUCE and isinstance(score.body, Apply) and score.body.op is Op.MUL
          and not _reductions(score.body))
    return renamed(score, {score.var: DEPTH})


def canonical(x: Scalar, score: Reduce) -> Scalar:
    """x with every copy of the score (whatever its variable's name) as `score`."""
    return rebuilt(x, lambda s: score if isinstance(s, Reduce) and renamed(s, {s.var: DEPTH}) == score else s)


def _guards(guard: Scalar, keys: Expr, score: Reduce) -> tuple[Reduce, ...]:
    """G's reductions over the keys, each over elementwise functions of the score and loads."""
    out = []
    for r in _reductions(guard):
        _need(r.extent == keys and r.op in (Op.SUM_REDUCE, Op.MAX_REDUCE))
        body = renamed(r.body, {r.var: KEY})
        inner = _reductions(body)
        _need(all(renamed(s, {s.var: DEPTH}) == score for s in inner))
        out.append(r)
    _need(out)
    return tuple(out)


def _masked_part(logit: Scalar, score: Reduce) -> tuple[Scalar | None, float | None]:
    """(B, c) where X = A + B, A reading S and B not (the mask), and A = c·S where it is (else c
    is None): X is -inf wherever B is, at any finite S."""
    if not (isinstance(logit, Apply) and logit.op is Op.ADD):
        return None, None
    reads = [bool(_reductions(a)) for a in logit.args]
    if reads.count(True) != 1:
        return None, None
    part, factor = logit.args[reads.index(False)], logit.args[reads.index(True)]
    if factor == score:
        return part, 1.0
    if isinstance(factor, Apply) and factor.op is Op.MUL and score in factor.args:
        constant = factor.args[1] if factor.args[0] == score else factor.args[0]
        if isinstance(constant, Const):
            return part, float(constant.value)
    return part, None


# --- rendering the pointwise pieces ----------------------------------------------------------
def snippet(value: Scalar, known: dict[Scalar, str], target: str) -> list[str]:
    """C statements setting the existing variable `target` to `value`, in a block of their own;
    `known` maps subexpressions (the score, the guards' accumulators) to variables in scope."""
    body = _Body([], KernelConfig())
    for s, name in known.items():
        body.memo[s] = (name, 0)
    code, _ = body.emit(value)
    return ["{", *("  " + line for line in body.blocks[0]), f"  {target} = {code};", "}"]


def guard_update(r: Reduce, acc: str, value: str) -> str:
    """Fold one key's value into a guard's accumulator."""
    _, _, combine = reduction_accumulator(r)
    return f"{acc} = {combine.format(a=acc, b=value)};"


def guard_start(r: Reduce) -> tuple[str, str]:
    """A guard accumulator's C type and start."""
    acc_type, start, _ = reduction_accumulator(r)
    return acc_type, start


def guard_body(a: Attention, r: Reduce) -> Scalar:
    return canonical(renamed(r.body, {r.var: KEY}), a.score)


def emit_c_attention(a: Attention, config: AttentionConfig, name: str) -> str:
    """The online-softmax pass in C: one query row per iteration of a parallel loop, keys one at a
    time (the CPU has no tile to skip)."""
    kernel, depth = a.kernel, a.depth
    params = [f"{STORAGE[b.dtype]}* restrict {b.name}" for b in kernel.outputs]
    params += [f"const {STORAGE[b.dtype]}* restrict {b.name}" for b in kernel.inputs]
    params.append("const int64_t* restrict kiln_sym")
    lines = [f"void {name}({', '.join(params)}) {{"]
    lines += [f"  const int64_t {s} = kiln_sym[{i}];" for i, s in enumerate(kernel.symbols)]
    rows = [(v, e) for v, e in kernel.loops if v != a.d]
    lines.append(f"  #pragma omp parallel for collapse({len(rows)}) schedule(dynamic)")
    for v, e in rows:
        lines.append(f"  for (int64_t {v} = 0; {v} < {index_code(e)}; {v}++)")
    lines.append("  {")
    inner = [f"float kiln_q[{depth}], kiln_acc[{depth}], kiln_m = -INFINITY, kiln_l = 0.0f;"]
    inner.append(f"for (int64_t {DEPTH} = 0; {DEPTH} < {depth}; {DEPTH}++) {{")
    inner.append(f"  kiln_q[{DEPTH}] = {_load(a.q.load)}; kiln_acc[{DEPTH}] = 0.0f;")
    inner.append("}")
    accs = {r: f"kiln_g{i}" for i, r in enumerate(a.guards)}
    for r, acc in accs.items():
        acc_type, start = guard_start(r)
        inner.append(f"{acc_type} {acc} = {start};")
    inner.append(f"for (int64_t {KEY} = 0; {KEY} < {index_code(a.keys)}; {KEY}++) {{")
    step = [f"float {SCORE} = 0.0f, kiln_x, kiln_e;"]
    # vectorized: a float sum is otherwise one dependent add after another (C keeps their order)
    step.append(f"#pragma omp simd reduction(+:{SCORE})")
    step.append(f"for (int64_t {DEPTH} = 0; {DEPTH} < {depth}; {DEPTH}++) {SCORE} += kiln_q[{DEPTH}] * {_load(a.k.load)};")
    step.append(f"{SCORE} *= {literal(a.q.scale * a.k.scale, DType.F32)};")
    known = {a.score: SCORE}
    for r, acc in accs.items():
        step.append(f"{COMPUTE[r.body.dtype]} kiln_gv;")
        step += snippet(guard_body(a, r), known, "kiln_gv")
        step.append(guard_update(r, acc, "kiln_gv"))
    step += snippet(a.logit, known, "kiln_x")
    step += _online_update(a, "kiln_x", "kiln_m", "kiln_l", "kiln_e", "kiln_rescale")
    step.append(f"for (int64_t {a.d} = 0; {a.d} < {depth}; {a.d}++)")
    step.append(f"  kiln_acc[{a.d}] = kiln_acc[{a.d}] * kiln_rescale + kiln_e * {_load(a.v)};")
    inner += ["  " + line for line in step]
    inner.append("}")
    inner.append(f"for (int64_t {a.d} = 0; {a.d} < {depth}; {a.d}++) {{")
    inner.append("  float kiln_out;")
    inner += ["  " + line for line in _output(a, accs, f"kiln_acc[{a.d}]", "kiln_l", "kiln_out")]
    dtype = kernel.output.dtype
    inner.append(f"  {kernel.output.name}[{index_code(kernel.store)}] = {store_code('kiln_out', dtype)};")
    inner.append("}")
    lines += ["    " + line for line in inner]
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def _load(load: Load) -> str:
    return load_code(load.buffer, index_code(load.index), load.dtype)


def _online_update(a: Attention, x: str, m: str, l: str, e: str, rescale: str) -> list[str]:
    """One key folded into the running maximum and sum: E and the factor the running sums take."""
    scale = literal(a.exponent, DType.F32)
    return [f"const float kiln_mn = {x} > {m} ? {x} : {m};",
            "const float kiln_ms = kiln_mn == -INFINITY ? 0.0f : kiln_mn;",
            f"const float {rescale} = exp2f(({m} - kiln_ms) * {scale});",
            f"{e} = exp2f(({x} - kiln_ms) * {scale});",
            f"{l} = {l} * {rescale} + {e};",
            f"{m} = kiln_mn;"]


def _output(a: Attention, accs: dict[Reduce, str], acc: str, l: str, target: str) -> list[str]:
    """The output element from its running sums: (Σ E·v) · recip(l), or the fill where G holds,
    rounded by the value's cast."""
    lines = [f"{target} = {acc} * (1.0f / {l});"]
    if a.guard is not None:
        lines.append("bool kiln_guard;")
        lines += snippet(a.guard, dict(accs), "kiln_guard")
        lines.append(f"if (kiln_guard) {target} = {literal(a.fill.value, DType.F32)};")
    if a.cast in _HALF:
        lines.append(f"{target} = kiln_{a.cast.value}_round({target});")
    return lines
