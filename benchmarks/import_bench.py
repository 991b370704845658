"""What the `torch.backends` entry point costs every `import torch`, and the first tpu tensor.

    python -m benchmarks.import_bench [--python PY] [--runs 10]

Fresh processes of `PY -c ...`, in alternating rounds so load on a shared machine hits every
case alike: `import torch` with torch's backend autoloading on (torchtpu's entry point runs)
and off (TORCH_DEVICE_BACKEND_AUTOLOAD=0), the `torch.backends` entry points alone (called as
torch calls them, in a process that imported torch with autoloading off: the least noisy
number) and `import torch; torch.randn(2, 2, device="tpu")`.
Each process reports its own `import torch` time (perf_counter around the import); the whole
process's wall time is measured outside. Prints medians, the on-off difference paired within a
round, where the first tensor's time goes, the machine's load and the threads.
Run it with the interpreter of an environment where torchtpu is installed (pip install .):
without the entry point in its metadata, "on" is plain torch and the script says so.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# Each prints a JSON dict of milliseconds measured inside the process.
IMPORT = ("import time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); import json, sys; "
          "print(json.dumps({'import_torch': 1e3 * (t1 - t0), "
          "'tpu_registered': torch._C._get_privateuse1_backend_name() == 'tpu', "
          "'jax_loaded': 'jax' in sys.modules}))")
FIRST_TENSOR = ("import time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
                "x = torch.randn(2, 2, device='tpu'); t2 = time.perf_counter(); x.cpu(); t3 = time.perf_counter(); "
                "import json; print(json.dumps({'import_torch': 1e3 * (t1 - t0), 'randn': 1e3 * (t2 - t1), "
                "'first_tensor': 1e3 * (t2 - t0), 'cpu': 1e3 * (t3 - t2)}))")
# The entry point alone, called as torch calls it (torch imported with autoloading off first).
# Finding entry points (reading every installed package's metadata) torch does installed or not.
ENTRY = ("import torch, time, json, importlib.metadata as m; t0 = time.perf_counter(); "
         "found = m.entry_points(group='torch.backends'); t1 = time.perf_counter(); "
         "[e.load()() for e in found]; t2 = time.perf_counter(); "
         "print(json.dumps({'find': 1e3 * (t1 - t0), 'entry_point': 1e3 * (t2 - t1)}))")
# Where the first tensor's time goes, step by step, autoloading off so each step is timed alone.
STEPS = ("import time, json; ms = {}; t = time.perf_counter()\n"
         "def step(name):\n"
         "    global t\n"
         "    now = time.perf_counter(); ms[name] = 1e3 * (now - t); t = now\n"
         "import torch; step('import torch (autoload off)')\n"
         "import torchtpu.device; step('import torchtpu.device: the device, no kernels')\n"
         "torch.tpu._lazy_init(); step('its kernels (torch.tpu._lazy_init)')\n"
         "import jax; step('import jax')\n"
         "from torchtpu.device import transfer; transfer.device(); step('PJRT client and the device')\n"
         "x = torch.randn(2, 2, device='tpu'); step('randn: its program (disk cache) and run')\n"
         "print(json.dumps(ms))\n")
OFF = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
CASES = {"on": (IMPORT, {}), "off": (IMPORT, OFF), "entry": (ENTRY, OFF), "tensor": (FIRST_TENSOR, {})}


def run(python: str, code: str, env: dict, cwd: str) -> tuple[float, dict]:
    """(wall ms of the whole process, the dict it printed)."""
    t0 = time.perf_counter()
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    wall = 1e3 * (time.perf_counter() - t0)
    if out.returncode != 0:
        raise RuntimeError(f"{python} -c {code!r} failed:\n{out.stderr[-3000:]}")
    return wall, json.loads(out.stdout.strip().splitlines()[-1])


def entry_point(python: str, env: dict, cwd: str) -> str | None:
    code = ("import importlib.metadata as m, json; print(json.dumps([e.value for e in "
            "m.entry_points(group='torch.backends') if e.value.startswith('torchtpu')]))")
    found = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    values = json.loads(found.stdout.strip() or "[]")
    return values[0] if values else None


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min) {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose environment is measured")
    parser.add_argument("--runs", type=int, default=10, help="fresh processes per case")
    args = parser.parse_args(argv)
    cwd = tempfile.mkdtemp(prefix="import-bench-")  # no package of the current directory shadows the installed one
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    where = subprocess.run([args.python, "-c", "import torchtpu, torch; print(torchtpu.__file__, torch.__version__, "
                            "f'(torch threads {torch.get_num_threads()})')"],
                           capture_output=True, text=True, env=dict(env, **OFF),
                           cwd=cwd, timeout=300).stdout.strip()
    ep = entry_point(args.python, env, cwd)
    print(f"python {args.python}\ntorchtpu, torch: {where}\nentry point torch.backends: {ep or 'NOT INSTALLED'}")
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; before: {load()}")
    if ep is None:
        print("without the entry point both import cases are plain torch: install the project (pip install .)")

    run(args.python, FIRST_TENSOR, env, cwd)  # warms the disk cache and the OS's file cache
    samples = {name: [] for name in CASES}
    for _ in range(args.runs):
        for name, (code, extra) in CASES.items():
            samples[name].append(run(args.python, code, dict(env, **extra), cwd))
    steps = run(args.python, STEPS, dict(env, **OFF), cwd)[1]
    print(f"after: {load()}\n")

    def median(name, key):
        return statistics.median(s[1][key] if key else s[0] for s in samples[name])

    print(f"median of {args.runs} fresh processes, ms | import torch (in-process) | whole process (wall)")
    print("-" * 84)
    for name, label in [("off", "import torch, TORCH_DEVICE_BACKEND_AUTOLOAD=0"),
                        ("on", "import torch, autoload on (torchtpu's entry point)")]:
        print(f"{label:52s} | {median(name, 'import_torch'):10.1f} | {median(name, None):10.1f}")
    paired = [on[1]["import_torch"] - off[1]["import_torch"] for on, off in zip(samples["on"], samples["off"])]
    paired_wall = [on[0] - off[0] for on, off in zip(samples["on"], samples["off"])]
    print(f"{'on - off, paired within a round':52s} | {statistics.median(paired):10.1f} | "
          f"{statistics.median(paired_wall):10.1f}")
    print(f"{'the entry points loaded and called, as torch does':52s} | {median('entry', 'entry_point'):10.1f} |")
    print(f"{'   finding them (torch does it, installed or not)':52s} | {median('entry', 'find'):10.1f} |")
    print(f"{'import torch; torch.randn(2, 2, device=tpu)':52s} | {median('tensor', 'first_tensor'):10.1f} | "
          f"{median('tensor', None):10.1f}")
    print(f"{'   of which randn (kernels, JAX, PJRT, program)':52s} | {median('tensor', 'randn'):10.1f} |")
    on = samples["on"][-1][1]
    print(f"\nautoload on: tpu registered {on['tpu_registered']}, jax loaded by import torch {on['jax_loaded']}")
    print("the first tensor, step by step (one process, ms):")
    for name, ms in steps.items():
        print(f"  {name:52s} {ms:8.1f}")


if __name__ == "__main__":
    main()
