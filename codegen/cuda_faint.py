"""Skipping faint key tiles in fused attention (codegen/cuda_attention.py): a warp's test, from
its rows' running maxima, the tile's masked part and a bound on its scores, that every weight the
tile could give rounds to 0 in f32, so that its products and exponentials need not run."""
from __future__ import annotations

from ..ir.dtypes import DType
from ..ir.ops import Op
from .attention import Attention, AttentionConfig
from .c_emit import literal
from .kernel import Reduce


# A tile is faint for a row when its masked part lies so far below the row's running maximum m
# that no score the row's query and the tile's keys can produce lifts a weight above 2^-FAINT:
# with |S| <= Σ_k |q_k| · max |k| (|c·S| with its rounding slack, 2^-10) and X rounded once more
# (2^-23), every weight is exp2((X - m')·L) <= 2^-FAINT for the final maximum m' >= m, which is 0 in
# f32 (the interpreter's exponential of it too). NaN anywhere fails a comparison: no skip.
FAINT = 200


def faint_skip(a: Attention) -> bool:
    """Whether faint tiles may be skipped: X = c·S + B, and every guard is a maximum whose
    accumulator can saturate (a skipped tile cannot change a saturated one)."""
    return (a.masked_part is not None and a.score_factor is not None
            and all(r.op is Op.MAX_REDUCE and (r.dtype is DType.BOOL or r.dtype.is_float) for r in a.guards))


def saturated(r: Reduce, acc: str) -> str:
    return acc if r.dtype is DType.BOOL else f"({acc} == INFINITY || {acc} != {acc})"


def widened_half(word: str, half: int, dtype: DType) -> str:
    """One 16-bit half (0: low) of a 32-bit word, as a float."""
    bits = f"({word} & 0xFFFFu)" if half == 0 else f"({word} >> 16)"
    return f"kiln_{dtype.value}_load((uint16_t){bits})"


def query_norms(a: Attention) -> list[str]:
    """Σ_k |q_k| of the lane's two rows (its four lanes' halves summed)."""
    words = [f"kiln_qa[kiln_kk][{h}]" for h in range(4)]
    terms = {r: " + ".join(f"fabsf({widened_half(w, half, a.dtype)})" for w in words[r::2] for half in (0, 1))
             for r in (0, 1)}
    return ["float kiln_qnorm[2] = {0.0f, 0.0f};",
            "#pragma unroll",
            f"for (int kiln_kk = 0; kiln_kk < {a.depth // 16}; kiln_kk++) {{",
            f"  kiln_qnorm[0] += {terms[0]};",
            f"  kiln_qnorm[1] += {terms[1]};",
            "}",
            "#pragma unroll",
            "for (int kiln_r = 0; kiln_r < 2; kiln_r++) {",
            "  kiln_qnorm[kiln_r] += __shfl_xor_sync(0xffffffffu, kiln_qnorm[kiln_r], 1);",
            "  kiln_qnorm[kiln_r] += __shfl_xor_sync(0xffffffffu, kiln_qnorm[kiln_r], 2);",
            "}"]


def faint_check(a: Attention, config: AttentionConfig, pitch: int, accs: dict) -> list[str]:
    """Set kiln_skip where the tile is faint for every row of the warp: first from the masked part
    and the running maxima alone, then, only if that passes, with the bound on |S| (the largest
    |k| of the staged tile, read by the warp from shared memory: the 15 bits below the sign
    compare as the magnitudes do, a NaN's above infinity's)."""
    exponent = literal(a.exponent, DType.F32)
    factor = repr(abs(a.q.scale * a.k.scale * a.score_factor))
    all_saturated = " && ".join(saturated(r, f"{acc}[kiln_r]") for r, acc in accs.items()) or "true"
    chunks = config.keys * a.depth // 8
    largest = widened_half("kiln_kbits", 0, a.dtype)
    return ["if (!kiln_skip) {",
            "  bool kiln_faint = true;",
            "  #pragma unroll",
            "  for (int kiln_r = 0; kiln_r < 2; kiln_r++)",
            "    if (kiln_row0 + kiln_g + kiln_r * 8 < kiln_nq)",
            f"      kiln_faint = kiln_faint && {all_saturated} && (kiln_bmax[kiln_r] - kiln_m[kiln_r]) * {exponent} <= -{FAINT}.0f;",
            "  if (__all_sync(0xffffffffu, kiln_faint)) {",
            "    uint32_t kiln_kbits = 0u;",
            f"    for (int kiln_i = kiln_lane; kiln_i < {chunks}; kiln_i += 32) {{",
            f"      const uint4 kiln_w = *reinterpret_cast<const uint4*>(&kiln_ks[(kiln_i / {a.depth // 8}) * {pitch} "
            f"+ (kiln_i % {a.depth // 8}) * 8]);",
            "      kiln_kbits = __vmaxu2(__vmaxu2(kiln_kbits, kiln_w.x & 0x7FFF7FFFu), __vmaxu2(kiln_w.y & 0x7FFF7FFFu, "
            "kiln_w.z & 0x7FFF7FFFu));",
            "      kiln_kbits = __vmaxu2(kiln_kbits, kiln_w.w & 0x7FFF7FFFu);",
            "    }",
            "    kiln_kbits = __reduce_max_sync(0xffffffffu, max(kiln_kbits & 0xFFFFu, kiln_kbits >> 16));",
            f"    const double kiln_reach = {factor} * (1.0 + 0x1p-10) * (double){largest};",
            "    #pragma unroll",
            "    for (int kiln_r = 0; kiln_r < 2; kiln_r++) {",
            "      if (kiln_row0 + kiln_g + kiln_r * 8 < kiln_nq) {",
            "        const double kiln_u = (double)kiln_bmax[kiln_r] + kiln_reach * (double)kiln_qnorm[kiln_r];",
            f"        kiln_faint = kiln_faint && (kiln_u + fabs(kiln_u) * 0x1p-23 - (double)kiln_m[kiln_r]) * {exponent} "
            f"<= -{FAINT}.0;",
            "      }",
            "    }",
            "    kiln_skip = __all_sync(0xffffffffu, kiln_faint);",
            "  }",
            "}"]
