"""Fused attention on tensor cores (codegen/attention.py has the algebra): a block holds
`rows` query rows of one batch point (16 a warp), its queries' fragments in registers, and walks
the keys a tile at a time. Each tile's keys and values are staged in shared memory by cp.async,
two buffers deep (the next tile's arrive while this one computes); S = QKᵀ and P·V run as
mma.sync m16n8k16 (f16/bf16 in, f32 accumulate), read through ldmatrix; P stays in registers
between the two (an S accumulator's layout is the A operand's of the next product). The masked
part of X is read a tile ahead, into registers: its loads' latency hides behind a tile's work. A
warp skips a tile's products and exponentials where its masked part is -inf at every point of the
warp's rows (void: its guards still see it), or so far below each row's running maximum that no
score these queries and keys can produce would give a weight that is not 0 in f32 (faint, see
codegen/cuda_faint.py: a Llama's mask holds bf16's lowest value, not -inf); and stops evaluating
guards once they are saturated."""
from __future__ import annotations

from ..ir.dtypes import DType
from ..ir.ops import Op
from .attention import (DEPTH, KEY, SCORE, Attention, AttentionConfig, _output, as_attention,
                        guard_body, guard_start, guard_update, snippet)
from .c_emit import COMPUTE, STORAGE, index_code, literal, store_code
from .cuda_decode_attention import DecodeAttentionConfig, decode_space
from .cuda_faint import faint_check, faint_skip, query_norms, saturated
from ..ir.symbolic import Expr
from .index import stride
from .kernel import Apply, Const, IndexValue, Kernel, Load, Scalar

_MMA = {DType.BF16: "bf16", DType.F16: "f16"}
_PAD = 8          # halves past each staged row: rows 16 bytes apart modulo 128, no bank conflicts


SHARED_BYTES = 48 * 1024      # what a block may hold without opting in to more


def shared_bytes(depth: int, config: AttentionConfig) -> int:
    """Two tiles of keys and two of values, staged rows padded."""
    return 4 * config.keys * (depth + _PAD) * 2


def attention_space(kernel: Kernel) -> list[AttentionConfig | DecodeAttentionConfig]:
    """A fused kernel's tilings that fit in shared memory (no other configuration is worth timing:
    its loop nest computes each score once per output element); with one query a point (decode),
    cuda_decode_attention's splits of the keys."""
    a = as_attention(kernel)
    if a.query is None:
        return decode_space(a)
    depth = a.depth
    return [c for c in (AttentionConfig(64, 64), AttentionConfig(128, 64), AttentionConfig(64, 32),
                        AttentionConfig(128, 32)) if shared_bytes(depth, c) <= SHARED_BYTES]


def _aligned8(index, var: str) -> bool:
    """Whether eight elements along var from an index with var a multiple of 8 lie in one 16-byte
    word (buffers start 256-byte aligned)."""
    return all(c % 8 == 0 for mono, c in index.terms if mono != (var,))


def emit_cuda_attention(a: Attention, config: AttentionConfig, name: str) -> str:
    kernel, depth, tile = a.kernel, a.depth, config.keys
    if config.rows % 16 or tile % 16 or depth % 16:
        raise ValueError(f"config {config.key()}: rows, keys and depth must be multiples of 16")
    threads, pitch, mma = config.rows * 2, depth + _PAD, _MMA[a.dtype]
    loops = dict(kernel.loops)
    params = [f"{STORAGE[b.dtype]}* __restrict__ {b.name}" for b in kernel.outputs]
    params += [f"const {STORAGE[b.dtype]}* __restrict__ {b.name}" for b in kernel.inputs]
    params.append("const int64_t* __restrict__ kiln_sym")
    out = [f'extern "C" __global__ void __launch_bounds__({threads}) {name}({", ".join(params)}) {{']
    body = [f"const int64_t {s} = kiln_sym[{i}];" for i, s in enumerate(kernel.symbols)]
    body += [f"__shared__ __align__(16) uint16_t kiln_kbuf[2][{tile * pitch}], kiln_vbuf[2][{tile * pitch}];",
             "const int kiln_warp = threadIdx.x / 32, kiln_lane = threadIdx.x % 32;",
             "const int kiln_g = kiln_lane >> 2, kiln_t = kiln_lane & 3;",
             "int64_t kiln_b = blockIdx.y;"]
    for var in reversed(a.batch):
        body.append(f"const int64_t {var} = kiln_b % ({index_code(loops[var])}); kiln_b /= ({index_code(loops[var])});")
    body += [f"const int64_t kiln_nq = {index_code(loops[a.query])}, kiln_nk = {index_code(a.keys)};",
             # the last rows first: under a causal mask they see the most keys, and start first
             f"const int64_t kiln_row0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * {config.rows} + kiln_warp * 16;"]
    # the queries' A fragments: halves h of step kk at row g + (h&1)*8, column kk*16 + (h>>1)*8 + 2t
    body += [f"uint32_t kiln_qa[{depth // 16}][4];",
             "#pragma unroll",
             f"for (int kiln_kk = 0; kiln_kk < {depth // 16}; kiln_kk++) {{",
             "  #pragma unroll",
             "  for (int kiln_h = 0; kiln_h < 4; kiln_h++) {",
             f"    const int64_t {a.query} = kiln_row0 + kiln_g + (kiln_h & 1) * 8;",
             f"    const int64_t {DEPTH} = kiln_kk * 16 + (kiln_h >> 1) * 8 + 2 * kiln_t;",
             f"    kiln_qa[kiln_kk][kiln_h] = {a.query} < kiln_nq ? "
             f"(uint32_t){_raw(a.q.load)} | ((uint32_t){_raw(a.q.load, 1)} << 16) : 0u;",
             "  }",
             "}"]
    if faint_skip(a):
        body += query_norms(a)
    accs = {r: f"kiln_g{i}" for i, r in enumerate(a.guards)}
    body.append(f"float kiln_o[{depth // 8}][4] = {{}}, kiln_m[2] = {{-INFINITY, -INFINITY}}, kiln_l[2] = {{0.0f, 0.0f}};")
    for r, acc in accs.items():
        acc_type, start = guard_start(r)
        body.append(f"{acc_type} {acc}[2] = {{{start}, {start}}};")
    body.append("int kiln_buf = 0;")
    body += _sources(a, config, pitch)
    body += _stage(a, config, pitch, "0", "0")
    body.append("kiln_commit();")
    if a.masked_part is not None:
        body.append(f"float kiln_bv[{tile // 2}];")
        body += _masked_tile(a, tile, "0", "kiln_bv", "kiln_uv", "kiln_buv")
    body.append(f"for (int64_t kiln_j0 = 0; kiln_j0 < kiln_nk; kiln_j0 += {tile}) {{")
    body += ["  " + line for line in _tile(a, config, pitch, accs)]
    body.append("}")
    body += _finish(a, accs)
    out += ["  " + line for line in body]
    out.append("}")
    return (_HELPERS + "\n".join(out) + "\n").replace("MMA_TYPE", mma).replace("STORE", a.dtype.value)


def _raw(load, offset: int = 0) -> str:
    """The 16 bits of a load at DEPTH + offset (the operand's stride along it is 1)."""
    return f"{load.buffer}[{index_code(load.index)}{f' + {offset}' if offset else ''}]"


def _elements(tile: int, lines: list[str], first: str = "kiln_j0") -> list[str]:
    """`lines` for each accumulator element a lane holds in the tile starting at key `first`:
    element e of n-block e >> 2, at row g + ((e >> 1) & 1) * 8 and key 2t + (e & 1) of the block
    (kiln_r: which of the lane's two rows)."""
    return ["#pragma unroll",
            f"for (int kiln_e = 0; kiln_e < {tile // 2}; kiln_e++) {{",
            "  const int kiln_nb = kiln_e >> 2, kiln_c = kiln_e & 3, kiln_r = kiln_c >> 1;",
            "  const int64_t kiln_row = kiln_row0 + kiln_g + kiln_r * 8;",
            f"  const int64_t {KEY} = {first} + kiln_nb * 8 + 2 * kiln_t + (kiln_c & 1);",
            *("  " + line for line in lines),
            "}"]


def _split(tile: int, full: str, lines: list[str], first: str = "kiln_j0") -> list[str]:
    """`lines` (which test `kiln_inside`) for each element of the tile, in two copies: one where
    the whole warp's tile is in range (`full`: the tests fold away) and one checking each."""
    def copy(inside: str) -> list[str]:
        return ["  " + x for x in _elements(tile, [f"const bool kiln_inside = {inside};", *lines], first)]
    return [f"if ({full}) {{", *copy("true"), "} else {",
            *copy(f"kiln_row < kiln_nq && {KEY} < kiln_nk"), "}"]


def _full(tile: int, first: str) -> str:
    return f"kiln_row0 + 16 <= kiln_nq && {first} + {tile} <= kiln_nk"


def masked_loads(a: Attention, tile: int, first: str, target: str) -> list[str]:
    """The masked part B of the tile starting at `first` into `target` (-inf out of range)."""
    check = [f"{target}[kiln_e] = -INFINITY;",
             "if (kiln_inside) {",
             f"  const int64_t {a.query} = kiln_row;",
             *("  " + x for x in snippet(a.masked_part, {}, f"{target}[kiln_e]")),
             "}"]
    return _split(tile, _full(tile, first), check, first)


def _tile(a: Attention, config: AttentionConfig, pitch: int, accs: dict) -> list[str]:
    """One tile of keys: its masked part read once into registers (a warp whose part is -inf
    throughout skips the products), S = QKᵀ, the logits and guards, the online rescaling, P·V.
    The tile's keys and values were staged by the previous step (or before the loop); the next
    tile's are requested first, to arrive while this one computes."""
    tile, depth = config.keys, a.depth
    known = {a.score: SCORE}
    lines = [f"if (kiln_j0 + {tile} < kiln_nk) {{"]
    lines += ["  " + x for x in _stage(a, config, pitch, f"kiln_j0 + {tile}", "kiln_buf ^ 1")]
    lines += ["}", "kiln_commit();", "bool kiln_live = false;"]
    faint = faint_skip(a)
    if a.masked_part is not None:
        # this tile's part was read a step ago (its loads' latency hidden behind that step's
        # work); the next tile's is requested now
        known[a.masked_part] = "kiln_bv[kiln_e]"
        if faint:
            lines.append("float kiln_bmax[2] = {-INFINITY, -INFINITY};")
        def summary(b: str, each: list[str]) -> list[str]:
            out = [f"kiln_live |= {b} != -INFINITY;"]
            if faint:
                out.append(f"kiln_bmax[kiln_r] = ({b} > kiln_bmax[kiln_r] || {b} != {b}) ? {b} : kiln_bmax[kiln_r];")
            return each + ["  " + x for x in out] if each else out
        per_element = _elements(tile, summary("kiln_bv[kiln_e]", []))
        if _position_tests(a) is None:
            lines += per_element
        else:   # a uniform tile is a full one: both rows of every lane in range
            lines += ["if (kiln_uv) {", "  #pragma unroll", "  for (int kiln_r = 0; kiln_r < 2; kiln_r++) {",
                      *("    " + x for x in summary("kiln_buv", [])), "  }", "} else {",
                      *("  " + x for x in per_element), "}"]
        lines.append(f"float kiln_bn[{tile // 2}];")
        lines += _masked_tile(a, tile, f"kiln_j0 + {tile}", "kiln_bn", "kiln_un", "kiln_bun")
    else:
        lines.append("kiln_live = kiln_row0 < kiln_nq;")
    lines += ["const bool kiln_void = !__any_sync(0xffffffffu, kiln_live);",
              "kiln_wait_previous();",
              "__syncthreads();",
              "const uint16_t* kiln_ks = kiln_kbuf[kiln_buf];",
              "const uint16_t* kiln_vs = kiln_vbuf[kiln_buf];",
              "bool kiln_skip = kiln_void;"]
    if faint:
        lines += faint_check(a, config, pitch, accs)
    lines += [f"float kiln_sc[{tile // 8}][4] = {{}};",
              "if (!kiln_skip) {",
              "  #pragma unroll",
              f"  for (int kiln_nb = 0; kiln_nb < {tile // 8}; kiln_nb++) {{",
              *("    " + x for x in _key_fragments(depth, pitch)),
              "  }",
              "}"]
    scale = literal(a.q.scale * a.k.scale, DType.F32)
    saturable = all(r.op is Op.MAX_REDUCE and (r.dtype is DType.BOOL or r.dtype.is_float) for r in accs)
    if accs and saturable:
        # a saturated guard stays as it is whatever the keys ahead: stop evaluating it
        each = " && ".join(saturated(r, f"{acc}[kiln_r]") for r, acc in accs.items())
        lines += ["bool kiln_settled = true;",
                  "#pragma unroll",
                  "for (int kiln_r = 0; kiln_r < 2; kiln_r++)",
                  f"  kiln_settled = kiln_settled && (kiln_row0 + kiln_g + kiln_r * 8 >= kiln_nq || ({each}));",
                  "const bool kiln_open = !__all_sync(0xffffffffu, kiln_settled);"]
    def element(known: dict, guards: bool = True) -> list[str]:
        out = ["float kiln_x = -INFINITY;",
               "if (kiln_inside) {",
               f"  const int64_t {a.query} = kiln_row;",
               f"  const float {SCORE} = kiln_sc[kiln_nb][kiln_c] * {scale};"]
        if accs and guards:
            out.append("  if (kiln_open) {" if saturable else "  {")
            for r, acc in accs.items():
                out.append(f"    {COMPUTE[r.body.dtype]} kiln_gv;")
                out += ["    " + x for x in snippet(guard_body(a, r), known, "kiln_gv")]
                out.append("    " + guard_update(r, f"{acc}[kiln_r]", "kiln_gv"))
            out.append("  }")
        out += ["  " + x for x in snippet(a.logit, known, "kiln_x")]
        return out + ["}", "kiln_sc[kiln_nb][kiln_c] = kiln_x;"]

    def elements() -> list[str]:
        """The logits (and guards) of the tile's elements; of a uniform tile, with its one masked
        value, and once the guards are settled (from the first tiles on), without them."""
        checked = _split(tile, _full(tile, "kiln_j0"), element(known))
        if a.masked_part is None or _position_tests(a) is None:
            return checked
        uniform_known = {**known, a.masked_part: "kiln_buv"}

        def uniform(guards: bool) -> list[str]:
            return _elements(tile, ["const bool kiln_inside = true;", *element(uniform_known, guards)])
        if accs and saturable:
            lines = ["if (kiln_open) {", *("  " + x for x in uniform(True)),
                     "} else {", *("  " + x for x in uniform(False)), "}"]
        else:
            lines = uniform(True)
        return ["if (kiln_uv) {", *("  " + x for x in lines), "} else {", *("  " + x for x in checked), "}"]
    if accs and a.masked_part is not None and _guards_of_logit_maxima(a, known):
        # a void tile's logits are all -inf: each row's guards see one value, at any of its keys (a
        # faint one's guards are saturated)
        lines += ["if (kiln_void) {", "  #pragma unroll", "  for (int kiln_r = 0; kiln_r < 2; kiln_r++) {",
                  "    const int64_t kiln_row = kiln_row0 + kiln_g + kiln_r * 8;",
                  f"    const int64_t {KEY} = kiln_j0 + 2 * kiln_t;",
                  f"    if (kiln_row < kiln_nq && {KEY} < kiln_nk) {{",
                  f"      const int64_t {a.query} = kiln_row;",
                  f"      const float {SCORE} = 0.0f, kiln_hidden = -INFINITY;"]
        hidden = {a.score: SCORE, a.masked_part: "kiln_hidden"}
        for r, acc in accs.items():
            lines.append(f"      {COMPUTE[r.body.dtype]} kiln_gv;")
            lines += ["      " + x for x in snippet(guard_body(a, r), hidden, "kiln_gv")]
            lines.append("      " + guard_update(r, f"{acc}[kiln_r]", "kiln_gv"))
        lines += ["    }", "  }", "} else if (!kiln_skip) {"]
        lines += ["  " + x for x in elements()]
        lines.append("}")
    else:
        # a void tile's scores stay 0 (no product): its guards see the logits at S = 0
        lines += ["if (kiln_void || !kiln_skip) {", *("  " + x for x in elements()), "}"]
    exponent = literal(a.exponent, DType.F32)
    lines += ["if (!kiln_skip) {",
              "  float kiln_mt[2] = {-INFINITY, -INFINITY}, kiln_ms[2], kiln_rescale[2];",
              "  #pragma unroll",
              f"  for (int kiln_e = 0; kiln_e < {tile // 2}; kiln_e++)",
              "    kiln_mt[(kiln_e >> 1) & 1] = fmaxf(kiln_mt[(kiln_e >> 1) & 1], kiln_sc[kiln_e >> 2][kiln_e & 3]);",
              "  #pragma unroll",
              "  for (int kiln_r = 0; kiln_r < 2; kiln_r++) {",
              "    kiln_mt[kiln_r] = fmaxf(kiln_mt[kiln_r], __shfl_xor_sync(0xffffffffu, kiln_mt[kiln_r], 1));",
              "    kiln_mt[kiln_r] = fmaxf(kiln_mt[kiln_r], __shfl_xor_sync(0xffffffffu, kiln_mt[kiln_r], 2));",
              "    const float kiln_mn = fmaxf(kiln_m[kiln_r], kiln_mt[kiln_r]);",
              "    kiln_ms[kiln_r] = kiln_mn == -INFINITY ? 0.0f : kiln_mn;",
              f"    kiln_rescale[kiln_r] = kiln_exp2((kiln_m[kiln_r] - kiln_ms[kiln_r]) * {exponent});",
              "    kiln_m[kiln_r] = kiln_mn;",
              "    kiln_l[kiln_r] *= kiln_rescale[kiln_r];",
              "  }",
              "  #pragma unroll",
              f"  for (int kiln_nd = 0; kiln_nd < {depth // 8}; kiln_nd++)",
              "    #pragma unroll",
              "    for (int kiln_c = 0; kiln_c < 4; kiln_c++) kiln_o[kiln_nd][kiln_c] *= kiln_rescale[kiln_c >> 1];",
              "  #pragma unroll",
              f"  for (int kiln_ks16 = 0; kiln_ks16 < {tile // 16}; kiln_ks16++) {{",
              "    uint32_t kiln_pa[4];",
              "    #pragma unroll",
              "    for (int kiln_h = 0; kiln_h < 4; kiln_h++) {",
              "      const int kiln_nb = kiln_ks16 * 2 + (kiln_h >> 1), kiln_c = (kiln_h & 1) * 2;",
              f"      const float kiln_p0 = kiln_exp2((kiln_sc[kiln_nb][kiln_c] - kiln_ms[kiln_h & 1]) * {exponent});",
              f"      const float kiln_p1 = kiln_exp2((kiln_sc[kiln_nb][kiln_c + 1] - kiln_ms[kiln_h & 1]) * {exponent});",
              "      kiln_l[kiln_h & 1] += kiln_p0 + kiln_p1;",
              "      kiln_pa[kiln_h] = kiln_pack_STORE(kiln_p0, kiln_p1);",
              "    }",
              "    #pragma unroll",
              f"    for (int kiln_nd = 0; kiln_nd < {depth // 8}; kiln_nd += 2) {{",
              "      uint32_t kiln_b0, kiln_b1, kiln_b2, kiln_b3;",
              f"      kiln_ldsm_x4_trans(kiln_b0, kiln_b1, kiln_b2, kiln_b3, &kiln_vs[(kiln_ks16 * 16 + (kiln_lane & 15)) * {pitch} "
              "+ (kiln_nd + (kiln_lane >> 4)) * 8]);",
              "      kiln_mma_STORE(kiln_o[kiln_nd], kiln_pa, kiln_b0, kiln_b1);",
              "      kiln_mma_STORE(kiln_o[kiln_nd + 1], kiln_pa, kiln_b2, kiln_b3);",
              "    }",
              "  }",
              "}",
              "__syncthreads();   // every warp is done with this buffer before the next step refills it",
              "kiln_buf ^= 1;"]
    if a.masked_part is not None:
        copy = ["#pragma unroll", f"for (int kiln_e = 0; kiln_e < {tile // 2}; kiln_e++) kiln_bv[kiln_e] = kiln_bn[kiln_e];"]
        if _position_tests(a) is None:
            lines += copy
        else:
            lines += ["kiln_uv = kiln_un;", "kiln_buv = kiln_bun;", "if (!kiln_un) {", *("  " + x for x in copy), "}"]
    return lines


def _key_fragments(depth: int, pitch: int) -> list[str]:
    """S's n-block kiln_nb over the depth: its keys' B fragments read two steps of 16 at a time
    (ldmatrix.x4) where the depth has an even number of them."""
    if depth % 32:
        return ["#pragma unroll",
                f"for (int kiln_kk = 0; kiln_kk < {depth // 16}; kiln_kk++) {{",
                "  uint32_t kiln_b0, kiln_b1;",
                f"  kiln_ldsm_x2(kiln_b0, kiln_b1, &kiln_ks[(kiln_nb * 8 + (kiln_lane & 7)) * {pitch} "
                "+ kiln_kk * 16 + ((kiln_lane >> 3) & 1) * 8]);",
                "  kiln_mma_STORE(kiln_sc[kiln_nb], kiln_qa[kiln_kk], kiln_b0, kiln_b1);",
                "}"]
    return ["#pragma unroll",
            f"for (int kiln_kk = 0; kiln_kk < {depth // 16}; kiln_kk += 2) {{",
            "  uint32_t kiln_b0, kiln_b1, kiln_b2, kiln_b3;",
            f"  kiln_ldsm_x4(kiln_b0, kiln_b1, kiln_b2, kiln_b3, &kiln_ks[(kiln_nb * 8 + (kiln_lane & 7)) * {pitch} "
            "+ (kiln_kk + (kiln_lane >> 4)) * 16 + ((kiln_lane >> 3) & 1) * 8]);",
            "  kiln_mma_STORE(kiln_sc[kiln_nb], kiln_qa[kiln_kk], kiln_b0, kiln_b1);",
            "  kiln_mma_STORE(kiln_sc[kiln_nb], kiln_qa[kiln_kk + 1], kiln_b2, kiln_b3);",
            "}"]


def _position_tests(a: Attention) -> list[tuple[Apply, Expr]] | None:
    """The masked part's tests of positions (a causal mask's key <= query, a window's bounds), each
    `lhs < rhs` with its difference rhs - lhs, linear in the query's row and the key, where these
    tests are all the masked part reads of the row and the key; None where it reads them otherwise
    (a load of a mask, a position used as a number). Over a warp's 16 rows and a tile's keys each
    test may hold one value throughout: then the masked part is one value there (`_masked_tile`)."""
    varying = {a.query, KEY}
    tests: dict[Apply, Expr] = {}

    def position(x: Scalar) -> Expr | None:
        if isinstance(x, IndexValue) and x.dtype is DType.I64:
            return x.expr
        if isinstance(x, Const) and x.dtype is DType.I64:
            return Expr.of(int(x.value))
        return None

    def visit(x: Scalar) -> bool:
        if isinstance(x, Apply) and x.op is Op.LESS_THAN and len(x.args) == 2:
            lhs, rhs = (position(arg) for arg in x.args)
            if lhs is not None and rhs is not None and (lhs.symbols() | rhs.symbols()) & varying:
                difference = rhs - lhs
                for mono, _ in difference.terms:
                    reads = set().union(*({atom} if isinstance(atom, str) else atom.symbols() for atom in mono))
                    if reads & varying and mono not in ((a.query,), (KEY,)):
                        return False          # not linear in the row and the key
                tests[x] = difference
                return True
        if isinstance(x, Apply):
            return all(visit(arg) for arg in x.args)
        if isinstance(x, Const):
            return True
        if isinstance(x, IndexValue):
            return not x.expr.symbols() & varying
        if isinstance(x, Load):
            return not x.index.symbols() & varying
        return False

    if a.masked_part is None or not visit(a.masked_part) or not tests:
        return None
    return list(tests.items())


def _masked_tile(a: Attention, tile: int, first: str, target: str, flag: str, value: str) -> list[str]:
    """The masked part of the tile starting at key `first`: where the warp's rows and the tile's
    keys are all in range and each test of positions holds one value over them, that one value
    into `value` (`flag` set), computed once; else each element's into `target`."""
    tests = _position_tests(a)
    if tests is None:
        return masked_loads(a, tile, first, target)
    lines = [f"bool {flag} = false;", f"float {value} = 0.0f;", f"if ({_full(tile, first)}) {{",
             "  bool kiln_one = true;"]
    known = {}
    for i, (test, difference) in enumerate(tests):
        # the difference's least and greatest over rows row0 .. row0 + 15 and keys first .. first + tile - 1
        coefficient = dict(difference.terms)
        rest = Expr({m: c for m, c in difference.terms if m not in ((a.query,), (KEY,))})
        ends = [(coefficient.get((a.query,), 0), "kiln_row0", "(kiln_row0 + 15)"),
                (coefficient.get((KEY,), 0), f"({first})", f"({first} + {tile - 1})")]
        low = " + ".join([f"({index_code(rest)})"] + [f"{c} * {lo if c > 0 else hi}" for c, lo, hi in ends if c])
        high = " + ".join([f"({index_code(rest)})"] + [f"{c} * {hi if c > 0 else lo}" for c, lo, hi in ends if c])
        lines += [f"  const bool kiln_test{i} = ({low}) > 0;",
                  f"  kiln_one = kiln_one && (kiln_test{i} || ({high}) <= 0);"]
        known[test] = f"kiln_test{i}"
    lines += ["  if (kiln_one) {",
              *("    " + x for x in snippet(a.masked_part, known, value)),
              f"    {flag} = true;",
              "  }",
              "}",
              f"if (!{flag}) {{",
              *("  " + x for x in masked_loads(a, tile, first, target)),
              "}"]
    return lines


def _guards_of_logit_maxima(a: Attention, known: dict) -> bool:
    """Whether every guard is a maximum (one value counts as often as any number of copies) of an
    expression reading nothing but the score and the masked part."""
    def reads_only_known(x) -> bool:
        if x in known:
            return True
        return not isinstance(x, Load) and all(reads_only_known(c) for c in x.children())
    return all(r.op is Op.MAX_REDUCE and reads_only_known(guard_body(a, r)) for r in a.guards)


def _strided(a: Attention, config: AttentionConfig) -> bool:
    """Whether each thread's chunks of a staged tile lie at fixed places from one tile to the next:
    the keys' and values' rows 16-byte aligned, a key's rows a fixed stride apart, the threads
    taking whole rows' chunks the same at every step."""
    threads, per_row = config.rows * 2, a.depth // 8
    return (threads % per_row == 0 and (config.keys * per_row) % threads == 0
            and all(_aligned8(load.index, var) and stride(load.index, KEY) is not None
                    for load, var in ((a.k.load, DEPTH), (a.v, a.d))))


def _sources(a: Attention, config: AttentionConfig, pitch: int) -> list[str]:
    """Where this thread's first chunk of the keys and values lies, at the first tile, in memory
    and in the staged tile (computed once: a step's staging is then an add and a copy a chunk)."""
    if not _strided(a, config):
        return []
    lines = [f"const int kiln_key0 = threadIdx.x / {a.depth // 8}, kiln_col0 = (threadIdx.x % {a.depth // 8}) * 8;",
             f"const int kiln_at0 = kiln_key0 * {pitch} + kiln_col0;",
             "const uint16_t *kiln_ksrc, *kiln_vsrc;",
             "{",
             f"  const int64_t {KEY} = kiln_key0;"]
    for load, var, src in ((a.k.load, DEPTH, "kiln_ksrc"), (a.v, a.d, "kiln_vsrc")):
        lines += [f"  {{ const int64_t {var} = kiln_col0; {src} = &{load.buffer}[{index_code(load.index)}]; }}"]
    return lines + ["}"]


def _stage(a: Attention, config: AttentionConfig, pitch: int, first: str, buffer: str) -> list[str]:
    """Request the keys and values of the tile starting at key `first` into shared buffer
    `buffer`, 16 bytes a copy (cp.async, no registers on the way) where 16 bytes apart in memory
    too, else two bytes at a time; zeros past the last key (a value times a zero weight must be 0)."""
    tile, depth = config.keys, a.depth
    if _strided(a, config):
        keys = config.rows * 2 // (depth // 8)     # keys apart, a thread's chunks
        lines = ["#pragma unroll",
                 f"for (int kiln_u = 0; kiln_u < {tile * depth // 8 // (config.rows * 2)}; kiln_u++) {{",
                 f"  const int64_t kiln_key = {first} + kiln_key0 + kiln_u * {keys};",
                 "  const bool kiln_in = kiln_key < kiln_nk;"]
        for load, src, dest in ((a.k.load, "kiln_ksrc", "kiln_kbuf"), (a.v, "kiln_vsrc", "kiln_vbuf")):
            step = stride(load.index, KEY)
            lines.append(f"  kiln_copy16(&{dest}[{buffer}][kiln_at0 + kiln_u * {keys * pitch}], "
                         f"kiln_in ? {src} + (kiln_key - kiln_key0) * {step} : {load.buffer}, kiln_in);")
        return lines + ["}"]
    lines = [f"for (int kiln_i = threadIdx.x; kiln_i < {tile * depth // 8}; kiln_i += blockDim.x) {{",
             f"  const int kiln_key = kiln_i / {depth // 8}, kiln_col = (kiln_i % {depth // 8}) * 8;",
             f"  const bool kiln_in = {first} + kiln_key < kiln_nk;",
             f"  const int64_t {KEY} = kiln_in ? {first} + kiln_key : 0;"]
    for load, var, dest in ((a.k.load, DEPTH, "kiln_kbuf"), (a.v, a.d, "kiln_vbuf")):
        lines += ["  {", f"    const int64_t {var} = kiln_col;",
                  f"    uint16_t* kiln_to = &{dest}[{buffer}][kiln_key * {pitch} + kiln_col];"]
        if _aligned8(load.index, var):
            lines.append(f"    kiln_copy16(kiln_to, &{load.buffer}[{index_code(load.index)}], kiln_in);")
        else:
            lines += ["    #pragma unroll",
                      f"    for (int kiln_x = 0; kiln_x < 8; kiln_x++) "
                      f"kiln_to[kiln_x] = kiln_in ? {load.buffer}[{index_code(load.index)} + kiln_x] : (uint16_t)0;"]
        lines.append("  }")
    lines.append("}")
    return lines


def _finish(a: Attention, accs: dict) -> list[str]:
    """The lane's two rows: sums and guards over the four lanes sharing each, then the stores."""
    lines = ["#pragma unroll", "for (int kiln_r = 0; kiln_r < 2; kiln_r++) {",
             "  kiln_l[kiln_r] += __shfl_xor_sync(0xffffffffu, kiln_l[kiln_r], 1);",
             "  kiln_l[kiln_r] += __shfl_xor_sync(0xffffffffu, kiln_l[kiln_r], 2);"]
    for r, acc in accs.items():
        for lane in (1, 2):
            other = f"__shfl_xor_sync(0xffffffffu, {acc}[kiln_r], {lane})"
            if r.dtype is DType.BOOL:
                other = f"(bool)__shfl_xor_sync(0xffffffffu, (int){acc}[kiln_r], {lane})"
            lines.append(f"  {{ const {guard_start(r)[0]} kiln_gv = {other}; {guard_update(r, f'{acc}[kiln_r]', 'kiln_gv')} }}")
    lines.append("}")
    dtype = a.kernel.output.dtype
    rows = {r: f"{acc}[kiln_c >> 1]" for r, acc in accs.items()}
    lines += ["#pragma unroll",
              f"for (int kiln_nd = 0; kiln_nd < {a.depth // 8}; kiln_nd++) {{",
              "  #pragma unroll",
              "  for (int kiln_c = 0; kiln_c < 4; kiln_c++) {",
              f"    const int64_t {a.query} = kiln_row0 + kiln_g + (kiln_c >> 1) * 8;",
              f"    const int64_t {a.d} = kiln_nd * 8 + 2 * kiln_t + (kiln_c & 1);",
              f"    if ({a.query} < kiln_nq) {{",
              "      float kiln_out;"]
    lines += ["      " + x for x in _output(a, rows, "kiln_o[kiln_nd][kiln_c]", "kiln_l[kiln_c >> 1]", "kiln_out")]
    lines += [f"      {a.kernel.output.name}[{index_code(a.kernel.store)}] = {store_code('kiln_out', dtype)};",
              "    }", "  }", "}"]
    return lines


_HELPERS = r"""
// the PTX the template uses (tests/cuda_on_cpu.py emulates these on the CPU, bf16's)
#ifndef KILN_ATTENTION_HELPERS
#define KILN_ATTENTION_HELPERS
// 2^x in one special-function op: a result below 2^-126 (a weight or rescaling that small beside
// the row's largest, which is 1) is 0
__device__ __forceinline__ float kiln_exp2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ void kiln_copy16(uint16_t* to, const uint16_t* from, bool in) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(to);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(from), "r"(in ? 16 : 0));
}
__device__ __forceinline__ void kiln_commit() { asm volatile("cp.async.commit_group;"); }
// every copy requested before the latest commit has landed (this thread's; a barrier makes all)
__device__ __forceinline__ void kiln_wait_previous() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void kiln_ldsm_x2(uint32_t& r0, uint32_t& r1, const uint16_t* p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(s));
}
__device__ __forceinline__ void kiln_ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const uint16_t* p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(s));
}
__device__ __forceinline__ void kiln_ldsm_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const uint16_t* p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(s));
}
#endif
// the element type's own, named after it: one compiled unit may hold bf16 and f16 attention
#ifndef KILN_ATTENTION_STORE
#define KILN_ATTENTION_STORE
// two weights rounded to nearest even, packed in one instruction (lo in the low half)
__device__ __forceinline__ uint32_t kiln_pack_STORE(float lo, float hi) {
  uint32_t d; asm("cvt.rn.STOREx2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo)); return d;
}
__device__ __forceinline__ void kiln_mma_STORE(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.MMA_TYPE.MMA_TYPE.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif
"""
