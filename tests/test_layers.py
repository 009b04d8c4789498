"""The package layering (pyproject.toml's import-linter contracts): the pipeline's stages import
only earlier ones, only search imports egglog, the runtime never imports the frontend."""
from __future__ import annotations

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parent.parent


def test_the_imports_keep_every_layering_contract():
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0
