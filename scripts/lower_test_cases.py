"""Lower the GPU tests' tiny models (tests/test_cuda.py: TINY_CASES) into lowered/<tag>. The GPU
machine's torch cannot export some of them (heads64_bf16: a guard on the prompt length); its
tests then read the graphs saved here ($KILN_TEST_LOWERED, which scripts/gpu_session.sh points at
lowered/). Carry lowered/<tag> for each tag a test skipped or failed on for want of it.
    PYTHONPATH=.. python scripts/lower_test_cases.py [TAG ...]   (default: every case)"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # tests/ as a package

from kiln.frontend.hf import lower_causal_lm, save_lowered     # noqa: E402
from tests.test_cuda import TINY_CASES, tiny_model              # noqa: E402

for tag in sys.argv[1:] or TINY_CASES:
    model = tiny_model(tag)
    save_lowered(lower_causal_lm(model, TINY_CASES[tag][3]), f"lowered/{tag}", model)
    print(f"lowered/{tag}")
