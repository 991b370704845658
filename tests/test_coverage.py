"""The model-coverage suite (model_coverage.py, models in model_zoo.py): every model in float32,
bfloat16 and training against eager, with no host ops, except the kept failures of
coverage_expected.json (each with its reason; an unexpected pass fails).
Regenerate that table with: TORCHTPU_COVERAGE_REGEN=1 .venv/bin/python -m pytest tests/test_coverage.py
TORCHTPU_COVERAGE_WRITE=FILE writes this run's markdown table (as in docs/coverage.md) to FILE.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

import model_coverage as cov
from model_zoo import BY_NAME

warnings.filterwarnings("ignore")
_TABLE = cov.load_table()
_RESULTS: list[cov.Result] = []


@pytest.mark.parametrize("model,mode", [(m, mode) for m in cov.models() for mode in cov.MODES
                                        if cov.applies(BY_NAME[m], mode)])
def test_model(model, mode):
    if mode == "shapes" and BY_NAME[model].unrolled and not cov.full():
        pytest.skip("one graph per length by construction (minutes of compiles): runs in make coverage")
    result = cov.run(BY_NAME[model], mode)
    _RESULTS.append(result)
    print(f"{model}/{mode}: {result.status} error={result.error} bound={result.bound} "
          f"host_ops={result.host_ops} first_call_s={result.first_call_s} {result.detail}")
    if not cov.regenerating():
        cov.check(result, _TABLE)


def test_table_is_current():
    """Runs last: every table entry names a zoo model and a mode, and says why it is kept;
    with TORCHTPU_COVERAGE_REGEN=1 it rewrites the table from this session's results."""
    if cov.regenerating():
        cov.write_table(_RESULTS)
    if os.environ.get("TORCHTPU_COVERAGE_WRITE"):  # the markdown table of this session's results
        Path(os.environ["TORCHTPU_COVERAGE_WRITE"]).write_text(cov.render(_RESULTS, cov.load_table()) + "\n")
    table = cov.load_table()
    for key, entry in table.items():
        model, mode = key.split("/")
        assert model in BY_NAME and mode in cov.MODES, f"{key}: no such case"
        assert entry["reason"] and not entry["reason"].startswith("TODO"), f"{key}: give the reason it is kept"
