"""OpInfo conformance sweep (see opinfo_sweep.py): backend="tpu" vs eager, per OpInfo and dtype.

The expected-failure table opinfo_expected_failures.json keeps the known failures, each
with its reason. An expected failure that passes fails the test, so the table stays true.
Regenerate it with: TORCHTPU_OPINFO_REGEN=1 .venv/bin/python -m pytest tests/test_opinfo.py
`make test` tries fewer samples of the cases expected to pass (opinfo_sweep.QUICK_SAMPLES);
`make coverage` runs every case with MAX_SAMPLES (TORCHTPU_OPINFO_FULL=1).
"""
from __future__ import annotations

import json
import warnings

import pytest

import opinfo_sweep as sweep

warnings.filterwarnings("ignore")
_TABLE = sweep.load_table()
_RESULTS: dict[str, dict[str, tuple[str, str]]] = {}

PARAMS = [
    pytest.param(o, dtype, id=f"{dtype}-{sweep.case_name(o)}")
    for dtype in sweep.DTYPES
    for o in sweep.cases(dtype)
]


@pytest.mark.parametrize("opinfo,dtype", PARAMS)
def test_opinfo(opinfo, dtype):
    name = sweep.case_name(opinfo)
    expected = _TABLE.get(dtype, {}).get(name)
    result = sweep.run_case(opinfo, dtype, sweep.max_samples(dtype, expected))
    _RESULTS.setdefault(dtype, {})[name] = (result.status, result.detail)
    if sweep.regenerating():
        return
    if result.status == "uncapturable":
        assert expected is None or expected.startswith("uncapturable"), (
            f"{name} is uncapturable now but the table says: {expected}")
        return
    if expected is None:
        assert result.status == "pass", f"{name} [{dtype}] fails: {result.detail}"
    elif expected.startswith("uncapturable"):
        pytest.fail(f"{name} [{dtype}] is capturable now ({result.status}); regenerate the table")
    else:
        assert result.status == "fail", (
            f"{name} [{dtype}] now passes: remove it from {sweep.TABLE.name} (or regenerate)")


def test_pass_rates():
    """Prints the per-dtype pass rates; float32 must reach 95% of capturable OpInfos.

    Runs last in this module, over the results of test_opinfo in the same session.
    """
    if not _RESULTS:
        pytest.skip("run together with test_opinfo (the rates are computed from its results)")
    rates = {}
    for dtype, results in _RESULTS.items():
        capturable = [s for s, _ in results.values() if s != "uncapturable"]
        passed = sum(1 for s in capturable if s == "pass")
        rates[dtype] = (passed, len(capturable))
        print(f"opinfo {dtype}: {passed}/{len(capturable)} capturable pass "
              f"({100.0 * passed / max(len(capturable), 1):.1f}%), "
              f"{len(results) - len(capturable)} uncapturable")
    if sweep.regenerating():
        # Entry by entry, so a run over a subset (-k) updates just the cases it ran.
        merged = sweep.load_table()
        for dtype, results in _RESULTS.items():
            entries = merged.setdefault(dtype, {})
            for name, (status, detail) in results.items():
                if status == "pass":
                    entries.pop(name, None)
                else:
                    entries[name] = detail if status == "fail" else f"uncapturable: {detail}"
        sweep.TABLE.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
    if len(_RESULTS.get("float32", {})) == len(sweep.cases("float32")):  # the whole float32 sweep ran
        passed, total = rates["float32"]
        assert passed / total >= 0.95, f"float32 pass rate {passed}/{total} is under 95%"
