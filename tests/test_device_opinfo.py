"""The device OpInfo sweep's acceptance ratio and its table's consistency.

The sweep itself runs in test_device_opinfo_{0,1,2}.py (device_opinfo_sweep.py). Each of the two
sweeps keeps its expected-failure table exact (a case that fails without an entry, or passes with
one, fails its test), so the tables say which cases pass: the ratio is computed from them.
"""
from __future__ import annotations

from pathlib import Path

import device_opinfo_sweep as sweep
import opinfo_sweep


def test_float32_opinfos_passing_under_the_compiler_pass_on_the_device():
    compiled = sweep.compiler_passes("float32")
    on_device = sweep.device_passes("float32")
    both = compiled & on_device
    ratio = len(both) / len(compiled)
    print(f"device opinfo float32: {len(on_device)}/{len(sweep.cases('float32'))} cases pass on the tpu; "
          f"of the {len(compiled)} that pass under the compiler, {len(both)} ({100 * ratio:.1f}%)")
    assert ratio >= 0.95, f"only {len(both)}/{len(compiled)}: {sorted(compiled - on_device)}"


def test_table_names_only_swept_cases_with_reasons():
    table = sweep.load_table()
    assert set(table) <= set(sweep.DTYPES)
    for dtype_name, entries in table.items():
        swept = {opinfo_sweep.case_name(o) for o in sweep.cases(dtype_name)}
        assert set(entries) <= swept, f"{dtype_name}: stale entries {sorted(set(entries) - swept)}"
        assert all(reason.strip() for reason in entries.values())


def test_the_chunks_cover_every_case_once():
    for dtype_name in sweep.DTYPES:
        chunks = [opinfo_sweep.case_name(o) for k in range(sweep.CHUNKS) for o in sweep.cases(dtype_name, k)]
        assert sorted(chunks) == sorted(opinfo_sweep.case_name(o) for o in sweep.cases(dtype_name))
        assert len(set(chunks)) == len(chunks)
    for k in range(sweep.CHUNKS):  # each chunk has its file (pytest-xdist gives a worker whole files)
        assert Path(__file__).with_name(f"test_device_opinfo_{k}.py").exists()
