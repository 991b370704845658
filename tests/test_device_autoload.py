"""The `torch.backends` entry point: plain `import torch` makes device="tpu" work where torchtpu
is installed, loads no JAX, TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off, a failure warns instead
of breaking torch, and a CPU user's torch (HF Trainer, torch.accelerator, eager, torch.compile)
stays on the CPU. Each case is a fresh process: the entry point runs at `import torch`."""
from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchtpu.device import module as tpu_module

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
ENTRY_POINT = "torchtpu.autoload:load"
OFF = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}


def _installed() -> bool:
    return any(e.value == ENTRY_POINT for e in importlib.metadata.entry_points(group="torch.backends"))


needs_entry_point = pytest.mark.skipif(
    not _installed(), reason="torchtpu's torch.backends entry point is not in this environment's installed "
    "metadata (reinstall the project: pip install -e . ; the Makefile does when pyproject.toml changes)")
no_real_tpu = pytest.mark.skipif(tpu_module.platform_name(start=False) == "tpu", reason="a real TPU is attached")


def _python(code: str, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("TORCH_DEVICE_BACKEND_AUTOLOAD", "TORCHTPU_DEVICE_AVAILABLE")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env=dict(environ, **env))
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _json(code: str, **env) -> dict:
    return json.loads(_python(code, **env).stdout.strip().splitlines()[-1])


def test_pyproject_declares_the_entry_point():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared["torch.backends"] == {"tpu": ENTRY_POINT}
    module, _, name = ENTRY_POINT.partition(":")
    assert callable(getattr(importlib.import_module(module), name))


@needs_entry_point
def test_plain_import_torch_makes_tpu_tensors():
    canonical = ('import torch; x = torch.randn(2, 2, device="tpu"); y = torch.randn(2, 2, device="tpu"); '
                 'z = x @ y; print(z); print(z.device)\n')
    check = "import sys; print(float((z.cpu() - x.cpu() @ y.cpu()).abs().max()), 'torchtpu.device' in sys.modules)\n"
    lines = _python(canonical + check).stdout.strip().splitlines()
    assert lines[0].startswith("tensor([[") and lines[1].endswith("device='tpu:0')")
    assert lines[2] == "tpu:0"
    error, registered = lines[3].split()
    assert float(error) <= 1e-6 and registered == "True"


@needs_entry_point
def test_import_torch_registers_the_device_without_jax_or_kernels():
    code = ("import sys, json, torch\n"
            "from torchtpu.device import registration\n"
            "loaded = lambda: sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', "
            "'torchtpu.compiler', 'torchtpu.runtime', 'torchtpu.device.strict')))\n"
            "at_import = dict(name=torch._C._get_privateuse1_backend_name(), module=torch.tpu.__name__, "
            "loaded=loaded(), kernels=registration._kernels_registered)\n"
            "torch.empty(3, device='tpu')\n"
            "print(json.dumps(dict(at_import=at_import, kernels=registration._kernels_registered, loaded=loaded())))\n")
    out = _python(code, PYTHONWARNINGS="always")
    assert "torchtpu" not in out.stderr  # no warning of ours: every torch user would see it
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["at_import"] == {"name": "tpu", "module": "torchtpu.device.module", "loaded": [], "kernels": False}
    assert got["kernels"] is True and got["loaded"] == []  # the first tensor registers kernels, starts nothing


@needs_entry_point
def test_a_first_tensor_made_through_torch_ops_registers_the_kernels():
    # torch calls torch.tpu._lazy_init for factories and .to() from Python, not for torch.ops
    code = ("import json, torch\n"
            "from torchtpu.device import registration\n"
            "before = registration._kernels_registered\n"
            "x = torch.ops.aten.zeros.default([2, 3], device='tpu')\n"
            "y = torch.ops.aten.add.Tensor(x, 1.5)\n"
            "print(json.dumps(dict(before=before, after=registration._kernels_registered, "
            "device=str(y.device), values=y.cpu().tolist())))\n")
    got = _json(code)
    assert got == {"before": False, "after": True, "device": "tpu:0", "values": [[1.5] * 3] * 2}


@needs_entry_point
def test_autoload_off_leaves_torch_without_the_device():
    code = ("import sys, json, torch\n"
            "try:\n"
            "    torch.randn(2, device='tpu'); error = None\n"
            "except RuntimeError as e:\n"
            "    error = str(e)\n"
            "state = dict(error=error, name=torch._C._get_privateuse1_backend_name(),\n"
            "             torchtpu=[m for m in sys.modules if m.startswith('torchtpu')])\n"
            "import torchtpu.device\n"
            "state['explicit'] = torch.ones(2, device='tpu').add(1).tolist()\n"
            "print(json.dumps(state))\n")
    got = _json(code, **OFF)
    assert "device type at start of device string: tpu" in got["error"]  # torch's own error
    assert got["name"] == "privateuseone" and got["torchtpu"] == []
    assert got["explicit"] == [2.0, 2.0]  # the explicit import still works


def test_a_failed_registration_warns_once_and_leaves_torch_working():
    """Another PrivateUse1 backend got there first: the entry point warns with the reason and
    returns; torch works; the explicit import raises the full error. Also with -W error."""
    code = ("import json, warnings, torch\n"
            "torch.utils.rename_privateuse1_backend('other')\n"
            "from torchtpu import autoload\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    autoload.load()\n"
            "try:\n"
            "    import torchtpu.device; explicit = None\n"
            "except RuntimeError as e:\n"
            "    explicit = str(e)\n"
            "print(json.dumps(dict(warnings=[(w.category.__name__, str(w.message)) for w in caught],\n"
            "                      torch=torch.ones(2).add(1).tolist(), explicit=explicit)))\n")
    got = _json(code, **OFF)
    [(category, message)] = got["warnings"]
    assert category == "RuntimeWarning" and "already 'other'" in message and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in message
    assert got["torch"] == [2.0, 2.0] and "already 'other'" in got["explicit"]

    strict = subprocess.run([sys.executable, "-W", "error", "-c", code.replace("    warnings.simplefilter('always')\n", "")],
                            capture_output=True, text=True, timeout=600, env=dict(os.environ, **OFF))
    assert strict.returncode == 0, strict.stderr[-3000:]
    assert "already 'other'" in strict.stderr and json.loads(strict.stdout.splitlines()[-1])["torch"] == [2.0, 2.0]


# --- a CPU user's torch, with torchtpu installed ------------------------------------------------

ACCELERATOR = ("import json, tempfile, torch\n"
               "from transformers import TrainingArguments\n"
               "acc = torch.accelerator\n"
               "print(json.dumps(dict(trainer=str(TrainingArguments(output_dir=tempfile.mkdtemp(), report_to=[]).device),\n"
               "    available=acc.is_available(), current=str(acc.current_accelerator()),\n"
               "    checked=str(acc.current_accelerator(check_available=True)), tpu_available=torch.tpu.is_available())))\n")
CPU_LIBRARIES = ("import json, warnings, torch\n"
                 "from accelerate import PartialState\n"
                 "from torch.utils.data import DataLoader, TensorDataset\n"
                 "with warnings.catch_warnings(record=True) as caught:\n"
                 "    warnings.simplefilter('always')\n"
                 "    batch = next(iter(DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2, pin_memory=True)))[0]\n"
                 "print(json.dumps(dict(accelerate=str(PartialState().device), pinned=batch.is_pinned(),\n"
                 "    pin_warning=any('no accelerator' in str(w.message) for w in caught))))\n")


@needs_entry_point
@no_real_tpu
def test_cpu_users_keep_the_cpu():
    """Installed means registered in every torch process: Trainer, accelerate, DataLoader and
    accelerator checks must still see no accelerator without a TPU. torch names PrivateUse1 as
    the current accelerator once it is registered (it does not ask whether it is available)."""
    assert _json(ACCELERATOR) == {"trainer": "cpu", "available": False, "current": "tpu", "checked": "None",
                                  "tpu_available": False}
    assert _json(CPU_LIBRARIES) == _json(CPU_LIBRARIES, **OFF) == {"accelerate": "cpu", "pinned": False,
                                                                   "pin_warning": True}


@needs_entry_point
@no_real_tpu
def test_asking_for_the_emulated_device_moves_the_trainer_onto_it():
    assert _json(ACCELERATOR, TORCHTPU_DEVICE_AVAILABLE="1") == {
        "trainer": "tpu:0", "available": True, "current": "tpu", "checked": "tpu", "tpu_available": True}


CPU_WORK = """
import json, sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
x = torch.randn(4, 8)
loss = model(x).square().mean()
loss.backward()
eager = dict(loss=loss.item().hex(), grads=[p.grad.sum().item().hex() for p in model.parameters()])
jax_after_eager = "jax" in sys.modules
compiled = torch.compile(model, backend="tpu")(x)
print(json.dumps(dict(eager=eager, jax_after_eager=jax_after_eager, compiled_device=str(compiled.device),
                      compiled_error=(compiled - model(x)).abs().max().item(),
                      backend=torch._C._get_privateuse1_backend_name())))
"""


@needs_entry_point
def test_cpu_only_torch_code_is_unchanged():
    """Eager CPU training bit for bit as with autoloading off, nothing of the device loaded by it;
    torch.compile(backend="tpu") on CPU tensors gives CPU tensors, as without the device."""
    on, off = _json(CPU_WORK), _json(CPU_WORK, **OFF)
    assert on["backend"] == "tpu" and off["backend"] == "privateuseone"
    assert on["eager"] == off["eager"]
    assert on["jax_after_eager"] is False
    for run in (on, off):
        assert run["compiled_device"] == "cpu" and run["compiled_error"] <= 1e-6


def test_the_tpu_probe_runs_once_per_process(monkeypatch):
    """torch's optimizers ask `torch.accelerator.current_accelerator()` on every step, which asks
    our is_available; the probe behind it (a glob of the device files and a lookup of libtpu) ran
    each time: about 70 µs of every optimizer step of every CPU user with torchtpu installed."""
    globbed = []
    monkeypatch.setattr(tpu_module.glob, "glob", lambda pattern: globbed.append(pattern) or [])
    tpu_module._tpu_attached.cache_clear()
    try:
        assert [tpu_module._tpu_attached() for _ in range(3)] == [False] * 3
        assert globbed == list(tpu_module._TPU_FILES)
    finally:
        tpu_module._tpu_attached.cache_clear()
