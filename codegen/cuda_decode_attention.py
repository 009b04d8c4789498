"""Fused attention with one query a batch point (decode; codegen/attention.py has the algebra),
flash-decoding's way: the keys of each point (a query head) are split among `split` blocks, each
block's 4 warps take every fourth run of 32 keys of its part, a key a lane for the scores and
softmax, then the run's keys in turn for the output row (a lane holds every 32nd element of it),
keeping an online softmax.
The warps' running maxima, sums and output rows combine through shared memory, rescaled to the
block's maximum; with a split each block writes that partial to scratch memory, and the last of
a point's blocks to arrive (an atomic counter it resets for the next launch) combines the parts
in order, rescaled to their maximum, and writes the row. The key count is read at run time, so a
CUDA graph recorded at max_seq serves every position, its work growing with the context."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..ir.dtypes import DType
from ..ir.symbolic import Expr
from .attention import (DEPTH, KEY, SCORE, Attention, _load, _output, guard_body,
                        guard_start, guard_update, snippet)
from .c_emit import STORAGE, index_code, literal, reduction_accumulator, store_code
from .index import substitute

WARPS = 4
PARTIAL_BYTES = 8       # one scratch slot: a running maximum, sum, guard or output element


@dataclass(frozen=True)
class DecodeAttentionConfig:
    """Each batch point's keys shared among `split` blocks of WARPS warps."""
    split: int = 1

    def key(self) -> str:
        return f"decode-attention-s{self.split}"

    def to_json(self) -> dict:
        return {"decode_attention": {"split": self.split}}

    @staticmethod
    def from_json(data: dict) -> DecodeAttentionConfig:
        return DecodeAttentionConfig(int(data["decode_attention"]["split"]))


def points(a: Attention) -> int | None:
    """The batch points (query heads), where their number is fixed."""
    loops = dict(a.kernel.loops)
    count = 1
    for var in a.batch:
        if not loops[var].is_const:
            return None
        count *= loops[var].value
    return count


def decode_space(a: Attention) -> list[DecodeAttentionConfig]:
    """A split where the points are fixed in number (the scratch is allocated once): few points
    (a model's heads) leave most of a large GPU idle without one."""
    return [DecodeAttentionConfig(s) for s in ((1, 16, 4, 64) if points(a) is not None else (1,))]


def split_scratch(a: Attention, config: DecodeAttentionConfig) -> tuple[int, int]:
    """The bytes of a split launch's partials and its count of arrival counters (one a point)."""
    if config.split == 1:
        return 0, 0
    return points(a) * config.split * _slots(a) * PARTIAL_BYTES, points(a)


def _slots(a: Attention) -> int:
    """A partial's slots: the maximum, the sum, each guard, the output row."""
    return 2 + len(a.guards) + _width(a)


def _width(a: Attention) -> int:
    return dict(a.kernel.loops)[a.d].value


def emit_cuda_decode_attention(a: Attention, config: DecodeAttentionConfig, name: str) -> str:
    kernel, depth, width, parts = a.kernel, a.depth, _width(a), config.split
    loops = dict(kernel.loops)
    params = [f"{STORAGE[b.dtype]}* __restrict__ {b.name}" for b in kernel.outputs]
    params += [f"const {STORAGE[b.dtype]}* __restrict__ {b.name}" for b in kernel.inputs]
    params.append("const int64_t* __restrict__ kiln_sym")
    if parts > 1:
        params += ["unsigned char* __restrict__ kiln_scratch", "unsigned int* __restrict__ kiln_arrivals"]
    out = [f'extern "C" __global__ void __launch_bounds__({WARPS * 32}) {name}({", ".join(params)}) {{']
    body = [f"const int64_t {s} = kiln_sym[{i}];" for i, s in enumerate(kernel.symbols)]
    body += ["const int kiln_warp = threadIdx.x / 32, kiln_lane = threadIdx.x % 32;",
             f"const int64_t kiln_point = blockIdx.x / {parts};",
             f"const int kiln_part = blockIdx.x % {parts}; (void)kiln_part;",
             "int64_t kiln_b = kiln_point;"]
    for var in reversed(a.batch):
        body.append(f"const int64_t {var} = kiln_b % ({index_code(loops[var])}); kiln_b /= ({index_code(loops[var])});")
    body += [f"const int64_t kiln_nk = {index_code(a.keys)};",
             f"const int64_t kiln_chunk = (kiln_nk + {parts - 1}) / {parts};",
             "const int64_t kiln_begin = kiln_part * kiln_chunk;",
             "const int64_t kiln_end = kiln_begin + kiln_chunk < kiln_nk ? kiln_begin + kiln_chunk : kiln_nk;"]
    v_steps = -(-width // 32)
    body += [f"__shared__ float kiln_qs[{depth}];",
             f"for (int64_t {DEPTH} = threadIdx.x; {DEPTH} < {depth}; {DEPTH} += {WARPS * 32}) "
             f"kiln_qs[{DEPTH}] = {_load(a.q.load)};",
             "__syncthreads();",
             f"float kiln_acc[{v_steps}], kiln_m = -INFINITY, kiln_l = 0.0f;",
             "#pragma unroll",
             f"for (int kiln_i = 0; kiln_i < {v_steps}; kiln_i++) kiln_acc[kiln_i] = 0.0f;"]
    accs = {r: f"kiln_g{i}" for i, r in enumerate(a.guards)}
    for r, acc in accs.items():
        acc_type, start = guard_start(r)
        body.append(f"{acc_type} {acc} = {start};")
    body += _keys(a, accs, v_steps)
    body += _combine_warps(a, accs, v_steps)
    if parts > 1:
        body += _combine_parts(a, accs, parts)
    body += _store(a, accs)
    out += ["  " + line for line in body]
    out.append("}")
    return "\n".join(out) + "\n"


def _keys(a: Attention, accs: dict, v_steps: int) -> list[str]:
    """Each warp's keys, 32 at a time, a key a lane: the lane's score (the whole dot product, 16
    bytes a load where the key's row is aligned), logit and guards, so that the per-key work is
    done once, not in every lane; the chunk's maximum and sum across the lanes and one online
    update; then the lane's output elements over the chunk's keys, each key's weight broadcast
    from its lane. Without branches, so that the compiler may hoist every load: a key past the
    part's end reads the last one's, and its logit (-inf), guards and value are selected away."""
    width, known = _width(a), {a.score: SCORE}
    exponent = literal(a.exponent, DType.F32)
    step = [f"const int64_t {KEY} = kiln_j0 + kiln_lane < kiln_end ? kiln_j0 + kiln_lane : kiln_end - 1;",
            "const bool kiln_in = kiln_j0 + kiln_lane < kiln_end;",
            *_score(a),
            f"{SCORE} *= {literal(a.q.scale * a.k.scale, DType.F32)};"]
    for r, acc in accs.items():
        step.append(f"{_type(r)} kiln_gv;")
        step += snippet(guard_body(a, r), known, "kiln_gv")
        step.append(f"if (kiln_in) {guard_update(r, acc, 'kiln_gv')}")
    step += ["float kiln_x;", *snippet(a.logit, known, "kiln_x"),
             "if (!kiln_in) kiln_x = -INFINITY;",
             "float kiln_cm = kiln_x;",
             "#pragma unroll",
             "for (int kiln_o = 16; kiln_o >= 1; kiln_o >>= 1) {",
             "  const float kiln_y = __shfl_xor_sync(0xffffffffu, kiln_cm, kiln_o);",
             "  kiln_cm = kiln_y > kiln_cm ? kiln_y : kiln_cm;",
             "}",
             "const float kiln_mn = kiln_cm > kiln_m ? kiln_cm : kiln_m;",
             "const float kiln_ms = kiln_mn == -INFINITY ? 0.0f : kiln_mn;",
             f"const float kiln_rescale = exp2f((kiln_m - kiln_ms) * {exponent});",
             f"const float kiln_e = exp2f((kiln_x - kiln_ms) * {exponent});",
             "float kiln_cl = kiln_e;",
             "#pragma unroll",
             "for (int kiln_o = 16; kiln_o >= 1; kiln_o >>= 1) kiln_cl += __shfl_xor_sync(0xffffffffu, kiln_cl, kiln_o);",
             "kiln_m = kiln_mn;",
             "kiln_l = kiln_l * kiln_rescale + kiln_cl;",
             "#pragma unroll",
             f"for (int kiln_i = 0; kiln_i < {v_steps}; kiln_i++) kiln_acc[kiln_i] *= kiln_rescale;",
             "#pragma unroll",
             "for (int kiln_t = 0; kiln_t < 32; kiln_t++) {",
             "  const float kiln_p = __shfl_sync(0xffffffffu, kiln_e, kiln_t);",
             "  const bool kiln_pin = kiln_j0 + kiln_t < kiln_end;",
             f"  const int64_t {KEY} = kiln_pin ? kiln_j0 + kiln_t : kiln_end - 1;",
             "  #pragma unroll",
             f"  for (int kiln_i = 0; kiln_i < {v_steps}; kiln_i++) {{",
             f"    const int64_t {a.d} = kiln_lane + 32 * kiln_i;",
             f"    if ({a.d} < {width}) kiln_acc[kiln_i] += kiln_pin ? kiln_p * {_load(a.v)} : 0.0f;",
             "  }",
             "}"]
    lines = [f"for (int64_t kiln_j0 = kiln_begin + 32 * kiln_warp; kiln_j0 < kiln_end; kiln_j0 += {32 * WARPS}) {{"]
    lines += ["  " + line for line in step] + ["}"]
    # each lane's guards over its keys, then the warp's in every lane
    for r, acc in accs.items():
        combine = reduction_accumulator(r)[2]
        lines += ["#pragma unroll",
                  "for (int kiln_o = 16; kiln_o >= 1; kiln_o >>= 1) {",
                  f"  const {_type(r)} kiln_y = kiln_shfl_xor({acc}, kiln_o);",
                  f"  {acc} = {combine.format(a=acc, b='kiln_y')};",
                  "}"]
    return lines


def _score(a: Attention) -> list[str]:
    """S of the lane's key: q (staged in shared memory) times the key's row, read 8 elements at a
    time where the row starts on 16 bytes (its depth a multiple of 8), else an element a time."""
    depth, load = a.depth, a.k.load
    scalar = [f"for (int64_t {DEPTH} = 0; {DEPTH} < {depth}; {DEPTH}++) {SCORE} += kiln_qs[{DEPTH}] * {_load(load)};"]
    lines = [f"float {SCORE} = 0.0f;"]
    if depth % 8:
        return lines + ["#pragma unroll 16", *scalar]
    row = index_code(substitute(load.index, {DEPTH: Expr.of(0)}))
    return lines + [f"const {STORAGE[load.dtype]}* kiln_row = {load.buffer} + ({row});",
                    "if (((unsigned long long)kiln_row & 15) == 0) {",
                    "  #pragma unroll",
                    f"  for (int kiln_i = 0; kiln_i < {depth}; kiln_i += 8) {{",
                    "    float kiln_kv[8];",
                    f"    kiln_{load.dtype.value}x8(kiln_kv, kiln_row + kiln_i);",
                    "    #pragma unroll",
                    f"    for (int kiln_u = 0; kiln_u < 8; kiln_u++) {SCORE} += kiln_qs[kiln_i + kiln_u] * kiln_kv[kiln_u];",
                    "  }",
                    "} else {",
                    "  #pragma unroll 16",
                    *("  " + line for line in scalar),
                    "}"]


def _type(r) -> str:
    return reduction_accumulator(r)[0]


def _combine_warps(a: Attention, accs: dict, v_steps: int) -> list[str]:
    """The warps' maxima, sums, guards and output rows in shared memory, then every thread holds
    the block's maximum, sum and guards (kiln_m, kiln_l, the guard accumulators), and the output
    elements the block's threads take (kiln_bacc, at the row's element threadIdx.x + 128 k)."""
    width = _width(a)
    lines = [f"__shared__ float kiln_wm[{WARPS}], kiln_wl[{WARPS}], kiln_wacc[{WARPS}][{width}];"]
    lines += [f"__shared__ {_type(r)} kiln_wg{i}[{WARPS}];" for i, r in enumerate(accs)]
    lines += ["if (kiln_lane == 0) {", "  kiln_wm[kiln_warp] = kiln_m; kiln_wl[kiln_warp] = kiln_l;"]
    lines += [f"  kiln_wg{i}[kiln_warp] = {acc};" for i, acc in enumerate(accs.values())]
    lines += ["}",
              "#pragma unroll",
              f"for (int kiln_i = 0; kiln_i < {v_steps}; kiln_i++)",
              f"  if (kiln_lane + 32 * kiln_i < {width}) kiln_wacc[kiln_warp][kiln_lane + 32 * kiln_i] = kiln_acc[kiln_i];",
              "__syncthreads();"]
    per_thread = -(-width // (WARPS * 32))
    lines += _rescaled(a, accs, WARPS, "kiln_f", "kiln_wm[kiln_w]", "kiln_wl[kiln_w]",
                       lambda i, w: f"kiln_wg{i}[{w}]", "kiln_w")
    lines += [f"float kiln_bacc[{per_thread}];",
              "#pragma unroll",
              f"for (int kiln_n = 0; kiln_n < {per_thread}; kiln_n++) {{",
              f"  const int kiln_d = threadIdx.x + {WARPS * 32} * kiln_n;",
              "  kiln_bacc[kiln_n] = 0.0f;",
              f"  if (kiln_d < {width})",
              f"    for (int kiln_w = 0; kiln_w < {WARPS}; kiln_w++)",
              "      kiln_bacc[kiln_n] += kiln_wacc[kiln_w][kiln_d] * kiln_f[kiln_w];",
              "}"]
    return lines


def _rescaled(a: Attention, accs: dict, count: int, factors: str, maximum: str, total: str,
              guard: Callable[[int, str], str], index: str, shared: bool = False) -> list[str]:
    """kiln_m, kiln_l and the guard accumulators over `count` partials (`maximum` and `total` read
    partial `index`, `guard(i, which)` guard i of partial `which`), and `factors`[index]: the
    factor a partial's sums take to the common maximum; `shared`: the factors in shared memory,
    a partial a thread (many parts), else in every thread's registers (the warps)."""
    exponent = literal(a.exponent, DType.F32)
    threads = WARPS * 32
    first, step = ("threadIdx.x", threads) if shared else ("0", 1)
    lines = [f"{'__shared__ ' if shared else ''}float {factors}[{count}];",
             "kiln_m = -INFINITY;",
             "#pragma unroll",
             f"for (int {index} = 0; {index} < {count}; {index}++) {{",
             f"  const float kiln_pm = {maximum};",
             "  kiln_m = kiln_pm > kiln_m ? kiln_pm : kiln_m;",
             "}",
             "{",
             "  const float kiln_top = kiln_m == -INFINITY ? 0.0f : kiln_m;",
             "  #pragma unroll",
             f"  for (int {index} = {first}; {index} < {count}; {index} += {step})",
             f"    {factors}[{index}] = exp2f(({maximum} - kiln_top) * {exponent});",
             "}"]
    if shared:
        lines.append("__syncthreads();")
    lines += ["kiln_l = 0.0f;",
              "#pragma unroll",
              f"for (int {index} = 0; {index} < {count}; {index}++) kiln_l += {total} * {factors}[{index}];"]
    for i, (r, acc) in enumerate(accs.items()):
        combine = reduction_accumulator(r)[2]
        lines.append(f"{acc} = {guard(i, '0')};")
        lines.append(f"for (int {index} = 1; {index} < {count}; {index}++) "
                     f"{acc} = {combine.format(a=acc, b=guard(i, index))};")
    return lines


def _combine_parts(a: Attention, accs: dict, parts: int) -> list[str]:
    """Each block's partial to scratch; the last block of the point to arrive combines them: the
    parts' maxima, sums and guards staged in shared memory a part a thread, then each output
    element's parts read together (reads through L2, where the other blocks' writes are; all in
    flight at once, not one round trip a part)."""
    width, slots, guards = _width(a), _slots(a), len(accs)
    per_thread = -(-width // (WARPS * 32))
    types = [_type(r) for r in accs]

    def slot(part: str, k: str, kind: str = "float") -> str:
        return f"(({kind}*)(kiln_scratch + {PARTIAL_BYTES} * ((kiln_point * {parts} + {part}) * {slots} + {k})))"
    lines = ["if (threadIdx.x == 0) {",
             f"  *{slot('kiln_part', '0')} = kiln_m; *{slot('kiln_part', '1')} = kiln_l;"]
    lines += [f"  *{slot('kiln_part', str(2 + i), t)} = {acc};" for i, (t, acc) in enumerate(zip(types, accs.values()))]
    lines += ["}",
              f"for (int kiln_n = 0; kiln_n < {per_thread}; kiln_n++) {{",
              f"  const int kiln_d = threadIdx.x + {WARPS * 32} * kiln_n;",
              f"  if (kiln_d < {width}) *{slot('kiln_part', f'{2 + guards} + kiln_d')} = kiln_bacc[kiln_n];",
              "}",
              "__threadfence();   // the partials visible to the block that arrives last",
              "__syncthreads();",
              "__shared__ bool kiln_last;",
              "if (threadIdx.x == 0) {",
              f"  kiln_last = atomicAdd(kiln_arrivals + kiln_point, 1u) == {parts - 1}u;",
              "  if (kiln_last) kiln_arrivals[kiln_point] = 0u;   // ready for the next launch",
              "}",
              "__syncthreads();",
              "if (!kiln_last) return;",
              "__threadfence();",
              f"__shared__ float kiln_pmax[{parts}], kiln_psum[{parts}];"]
    lines += [f"__shared__ {t} kiln_pguard{i}[{parts}];" for i, t in enumerate(types)]
    lines += [f"for (int kiln_p = threadIdx.x; kiln_p < {parts}; kiln_p += {WARPS * 32}) {{",
              f"  kiln_pmax[kiln_p] = {_through_l2('float', slot('kiln_p', '0'))};",
              f"  kiln_psum[kiln_p] = {_through_l2('float', slot('kiln_p', '1'))};"]
    lines += [f"  kiln_pguard{i}[kiln_p] = {_through_l2(t, slot('kiln_p', str(2 + i), t))};" for i, t in enumerate(types)]
    lines += ["}", "__syncthreads();"]
    lines += _rescaled(a, accs, parts, "kiln_fp", "kiln_pmax[kiln_p]", "kiln_psum[kiln_p]",
                       lambda i, p: f"kiln_pguard{i}[{p}]", "kiln_p", shared=True)
    lines += [f"for (int kiln_n = 0; kiln_n < {per_thread}; kiln_n++) {{",
              f"  const int kiln_d = threadIdx.x + {WARPS * 32} * kiln_n;",
              "  kiln_bacc[kiln_n] = 0.0f;",
              f"  if (kiln_d < {width}) {{",
              "    #pragma unroll",
              f"    for (int kiln_p = 0; kiln_p < {parts}; kiln_p++)",
              f"      kiln_bacc[kiln_n] += {_through_l2('float', slot('kiln_p', f'{2 + guards} + kiln_d'))} * kiln_fp[kiln_p];",
              "  }",
              "}"]
    return lines


def _through_l2(kind: str, pointer: str) -> str:
    """A load that skips the block's L1 (which may hold a line from before another block wrote
    it): __ldcg, bools read as bytes."""
    if kind == "bool":
        return f"(__ldcg((const unsigned char*){pointer}) != 0)"
    if kind == "int64_t":
        return f"(int64_t)__ldcg((const long long*){pointer})"
    return f"__ldcg((const {kind}*){pointer})"


def _store(a: Attention, accs: dict) -> list[str]:
    """The output row from the sums: (Σ E·v) / l, or the fill where the guard holds, rounded."""
    kernel, width = a.kernel, _width(a)
    per_thread = -(-width // (WARPS * 32))
    lines = [f"for (int kiln_n = 0; kiln_n < {per_thread}; kiln_n++) {{",
             f"  const int64_t {a.d} = threadIdx.x + {WARPS * 32} * kiln_n;",
             f"  if ({a.d} < {width}) {{",
             "    float kiln_out;"]
    lines += ["    " + line for line in _output(a, accs, "kiln_bacc[kiln_n]", "kiln_l", "kiln_out")]
    lines += [f"    {kernel.output.name}[{index_code(kernel.store)}] = {store_code('kiln_out', kernel.output.dtype)};",
              "  }",
              "}"]
    return lines
