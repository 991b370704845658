"""Chunk 1 of the device OpInfo sweep (device_opinfo_sweep.py: tpu eager vs the CPU, forward and
backward; its expected-failure table and how to regenerate it are described there)."""
from __future__ import annotations

import warnings

import pytest

import device_opinfo_sweep as sweep
import opinfo_sweep

warnings.filterwarnings("ignore")
_TABLE = sweep.load_table()
_RESULTS: dict = {}

PARAMS = [
    pytest.param(o, dtype, id=f"{dtype}-{opinfo_sweep.case_name(o)}")
    for dtype in sweep.DTYPES
    for o in sweep.cases(dtype, chunk=1)
]


@pytest.fixture(scope="module", autouse=True)
def _regenerate_at_the_end():
    with sweep.memory_cache_only():
        yield
    if opinfo_sweep.regenerating() and _RESULTS:
        sweep.write_results(_RESULTS)


@pytest.mark.parametrize("opinfo,dtype", PARAMS)
def test_device_opinfo(opinfo, dtype):
    sweep.check(opinfo, dtype, _TABLE, _RESULTS)
