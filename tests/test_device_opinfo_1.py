"""Chunk 1 of the device OpInfo sweep (device_opinfo_sweep.py: tpu eager vs the CPU, forward and
backward; its expected-failure table and how to regenerate it are described there). The sweep is
split into files so that pytest-xdist's per-file distribution spreads it over the workers."""
from __future__ import annotations

import warnings

import device_opinfo_sweep as sweep

warnings.filterwarnings("ignore")
test_device_opinfo, regenerate_at_the_end = sweep.chunk(1)
