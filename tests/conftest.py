"""Shared fixtures: the real SmolLM2 is loaded and lowered once per test session."""
from __future__ import annotations

import pytest

# Length of SmolLM2's static KV cache in the tests: the longest prompt plus 24 new tokens fit.
SMOLLM2_MAX_SEQ = 48


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes tens of seconds (a real model); runs by default, "
                                       "deselect with -m 'not slow'")


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the real SmolLM2-135M-Instruct; skipped where its package is missing."""
    from kiln import KilnError
    from kiln.frontend import hf
    try:
        return hf.load_smollm2()
    except KilnError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def smollm2_lowered(smollm2):
    """SmolLM2 as a LoweredLM: a dynamic-length prefill graph and a one-token decode graph."""
    from kiln.frontend import hf
    return hf.lower_causal_lm(smollm2[0], max_seq=SMOLLM2_MAX_SEQ)
