"""One benchmark cell, measured inside a fresh process (the child side of benchmarks/suite.py).

    python -m benchmarks.cells '{"workload": "infer", "model": "hf_llama", "backend": "tpu", "reps": 30}'

prints one JSON object on its last line: the cell's spec plus what it measured
(first_call_s, median_ms or median_us, peak_rss_mb). A cell that cannot run says why in
"na" (a reason) instead of numbers; a cell that fails raises, and the parent records the error.

Workloads:
    infer     forward under torch.no_grad()
    train     forward + loss, backward, AdamW step (the model and loss compiled, the
              optimizer step eager and identical for every backend)
    overhead  the graph `x * 2 + 1` on 16 floats ("tiny": the per-call cost of the compiled path)
              or on 4096 ("small": also what a program pays once PJRT hands it to a worker thread
              instead of running it on the caller, docs/DECISIONS.md 109)
    decode    one decode step of greedy generate with a static KV cache (benchmarks/generate_bench.py)
    floor     nothing built: the resident set of the backend's runtime alone, no compiler front
              end (torch imported; for tpu also torchtpu, JAX and the PJRT client; for inductor
              the code cache its generated code imports, which brings Dynamo), which the suite
              subtracts from the other cells' peaks

A cell with "precompiled": PATH (backend tpu, infer or train) loads the artifact at PATH with
torchtpu.precompile.load instead of calling torch.compile; "precompile_to": PATH instead saves
one there (a separate, untimed process: the suite runs it before the precompiled cell).
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
import warnings

OVERHEAD_NUMEL = {"tiny": 16, "small": 4096}
OVERHEAD_REPS = 2000  # a tiny call is microseconds long: many samples for a stable median


def compile_for(fn, backend: str, spec: dict | None = None, inputs: tuple = ()):
    """fn compiled for one backend column ("eager" returns fn itself); with spec["precompiled"],
    fn's artifact loaded (torchtpu.precompile.load: no tracing, no compile)."""
    import torch

    if spec and spec.get("precompiled"):
        import torchtpu.precompile

        run = torchtpu.precompile.load(spec["precompiled"], fn if isinstance(fn, torch.nn.Module) else None)
        spec["_loaded"] = run.loaded
        return run
    if backend == "eager":
        return fn  # eager has nothing to compile
    if backend == "inductor":
        return torch.compile(fn, fullgraph=True)
    return torch.compile(fn, backend=backend, fullgraph=True)


def time_first_and_steady(make_call, reps: int, warmup: int, unit: str = "ms") -> dict:
    """Times the first call (compiling included) and `reps` calls after warm-up.

    Args:
        make_call: builds the compiled callable and returns a zero-argument function that runs
            one call; building is timed as part of the first call, as a user would see it.
        reps, warmup: steady-state samples and untimed calls before them.
        unit: "ms" or "us", the unit of the steady-state numbers.
    Returns:
        {"first_call_s", "median_<unit>", "min_<unit>", "p90_<unit>", "samples"}: the minimum is
        the number least disturbed by other load on a shared machine, the median the headline.
    """
    from benchmarks.timing import samples_ms

    t0 = time.perf_counter()
    call = make_call()
    call()
    first = time.perf_counter() - t0
    scale = 1e3 if unit == "us" else 1.0
    samples = sorted(v * scale for v in samples_ms(call, warmup=warmup, runs=reps))
    return {"first_call_s": first, f"median_{unit}": statistics.median(samples), f"min_{unit}": samples[0],
            f"p90_{unit}": samples[int(0.9 * (len(samples) - 1))], "samples": reps}


def max_abs_err(actual, expected) -> float:
    """The largest |actual - expected| over all tensor outputs (HF output objects included)."""
    import torch
    from torch.utils import _pytree as pytree

    pairs = zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected))
    return max((float((a.float() - e.float()).abs().max()) for a, e in pairs if isinstance(e, torch.Tensor)),
               default=0.0)


def infer(spec: dict) -> dict:
    from benchmarks.run import build

    model, inputs = build(spec["model"], spec.get("batch"), spec.get("size"))
    return _timed_and_checked(model, inputs, spec, "ms")


def _timed_and_checked(fn, inputs, spec: dict, unit: str) -> dict:
    """Times fn compiled for spec's backend, then checks its output against eager fn.

    The check runs after the timing so that eager's first call cannot warm anything the
    compiled first call is timed on; a benchmark of wrong numbers would be worthless.
    """
    import torch

    holder = {}

    def make_call():
        holder["fn"] = compile_for(fn, spec["backend"], spec)
        return _bind(holder["fn"], inputs)

    with torch.no_grad():
        if spec.get("precompile_to"):
            return _save(fn, inputs, spec["precompile_to"])
        result = time_first_and_steady(make_call, spec["reps"], spec["warmup"], unit)
        if spec["backend"] != "eager":
            result["max_abs_err"] = max_abs_err(holder["fn"](*inputs), fn(*inputs))
    return result


def train(spec: dict) -> dict:
    import torch

    from benchmarks.run import build

    model, inputs = build(spec["model"], spec.get("batch"), spec.get("size"))
    model.train()
    target = target_for(spec["model"], model, inputs)
    args = (model, *inputs, target)  # the model is an argument: a precompiled artifact names its function
    if spec.get("precompile_to"):
        return _save(train_loss, args, spec["precompile_to"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def make_step():
        compiled = compile_for(train_loss, spec["backend"], spec)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = compiled(*args)
            loss.backward()
            opt.step()
        return step

    return time_first_and_steady(make_step, spec["reps"], spec["warmup"])


def overhead(spec: dict) -> dict:
    import torch

    numel = OVERHEAD_NUMEL[spec["model"]]
    x = torch.randn(numel)

    def tiny(t):
        return t * 2 + 1

    reps = spec["reps"] if spec.get("quick") else max(spec["reps"], OVERHEAD_REPS)
    result = _timed_and_checked(tiny, (x,), {**spec, "reps": reps, "warmup": spec["warmup"] * 10}, "us")
    return {**result, "numel": numel}


def decode(spec: dict) -> dict:
    from benchmarks.decode_cell import decode_step

    return decode_step(spec["backend"], quick=bool(spec.get("quick")))


def _bind(fn, inputs):
    return lambda: fn(*inputs)


def target_for(name: str, model, inputs):
    """A fixed target for the loss: classes for a model with logits or a classifier head (the CNN),
    else random values shaped like the model's main output (hidden states, a denoised sample)."""
    import torch

    g = torch.Generator().manual_seed(1)
    if name == "cnn":
        return torch.randint(0, model.head.out_features, inputs[0].shape[:1], generator=g)
    with torch.no_grad():
        raw = model(*inputs)
    out = main_output(raw)
    if hasattr(raw, "logits"):  # a language model head: next-token classes
        return torch.randint(0, out.shape[-1], out.shape[:-1], generator=g)
    return torch.randn(out.shape, generator=g).to(out.dtype)


def main_output(out):
    """The tensor a loss is taken of: logits, else the last hidden state, else a diffusion model's
    sample, else the output itself (or its first tensor)."""
    import torch

    for field in ("logits", "last_hidden_state", "sample"):
        if getattr(out, field, None) is not None:
            return getattr(out, field)
    if isinstance(out, torch.Tensor):
        return out
    return next(v for v in (out.values() if hasattr(out, "values") else out) if isinstance(v, torch.Tensor))


def train_loss(model, *inputs_and_target):
    """The function compiled for a training step: forward and loss in one graph (cross entropy
    against class targets, MSE against real-valued ones). The last argument is the target."""
    import torch.nn.functional as F

    *inputs, target = inputs_and_target
    out = main_output(model(*inputs))
    if target.dtype.is_floating_point:
        return F.mse_loss(out.float(), target.float())
    return F.cross_entropy(out.flatten(0, -2).float(), target.flatten())


def _save(fn, args: tuple, path: str) -> dict:
    """Writes fn(*args)'s precompiled artifact (the cell's "precompile_to")."""
    import torchtpu.precompile

    t0 = time.perf_counter()
    torchtpu.precompile.save(fn, args, path)
    return {"save_s": time.perf_counter() - t0}


def _cache_counts(backend: str) -> dict:
    """Whether the compiler's caches were hit, so a "warm" cell can be seen to be warm."""
    if backend == "tpu":
        import torchtpu
        from torch._dynamo.utils import counters

        stats = torchtpu.stats()
        return {"xla_compiles": stats["xla_compiles"], "disk_hits": stats["disk_hits"],
                "dynamo_graphs": int(counters["stats"].get("unique_graphs", 0))}
    if backend == "inductor":
        from torch._dynamo.utils import counters

        return {"fxgraph_cache_hits": counters["inductor"]["fxgraph_cache_hit"],
                "autograd_cache_hits": counters["aot_autograd"]["autograd_cache_hit"]}
    return {}


def floor(spec: dict) -> dict:
    """The runtime floor: the process with the backend's runtime up and no model (peak_rss_mb)."""
    if spec["backend"] == "tpu":
        import torchtpu  # noqa: F401
        from torchtpu.runtime import platform

        platform.device()  # the PJRT client
    elif spec["backend"] == "inductor":
        # what running its generated code imports (the code cache; it brings Dynamo with it), not
        # its compiler: compile_fx would also load AOTAutograd, which tpu's floor does not hold
        import torch._inductor.codecache  # noqa: F401
    return {}


WORKLOADS = {"infer": infer, "train": train, "overhead": overhead, "decode": decode, "floor": floor}


def measure(spec: dict) -> dict:
    """Runs one cell in this process.

    Args:
        spec: {"workload", "backend", "reps", "warmup", and for model workloads "model",
            optionally "batch", "size", "quick"}.
    Returns:
        spec plus the measured values and peak_rss_mb (this process's peak resident set, less the
        device memory mapped into it, which is device_mapped_mb where there is any).
    """
    import torch

    warnings.filterwarnings("ignore")
    if os.environ.get("TORCHTPU_BENCH_THREADS"):  # suite --threads 1 (XLA's threads come from XLA_FLAGS)
        torch.set_num_threads(int(os.environ["TORCHTPU_BENCH_THREADS"]))
    torch.manual_seed(0)
    result = WORKLOADS[spec["workload"]](spec)
    if spec["workload"] != "floor":  # reading Dynamo's counters imports Dynamo: not part of a runtime floor
        result.update(_cache_counts(spec["backend"]))
    if spec["backend"] == "tpu":  # where its programs ran (the workload imported torchtpu already)
        from torchtpu.runtime import platform

        result["device"] = platform.device().device_kind
    if "_loaded" in spec:  # whether the artifact was used (else the cell compiled: not a precompiled start)
        result["precompiled_loaded"] = spec.pop("_loaded")
    mapped = device_mapped_kb()
    if mapped:  # an accelerator's memory window: counted in the resident set, not host memory
        result["device_mapped_mb"] = mapped / 1024
    return {**spec, **result, "peak_rss_mb": (peak_rss_kb() - mapped) / 1024}


# Mappings of an accelerator's own memory (a TPU's vfio window; /dev/accel*): the kernel counts
# their touched pages in the resident set, but they are the device's, not the host's RAM.
DEVICE_MAPPINGS = ("anon_inode:[vfio-device]", "/dev/vfio/", "/dev/accel")


def device_mapped_kb(smaps: str = "/proc/self/smaps") -> int:
    """Kilobytes of this process's resident set that map device memory (DEVICE_MAPPINGS); 0
    where there are none (the CPU platform) or smaps cannot be read. A TPU v5e process maps
    8 GiB of the chip this way once its PJRT client is open (docs/benchmarks.md)."""
    total, device = 0, False
    try:
        with open(smaps) as f:
            for line in f:
                fields = line.split()
                if not fields:
                    continue
                if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header line
                    path = fields[5] if len(fields) > 5 else ""
                    device = path.startswith(DEVICE_MAPPINGS)
                elif device and fields[0] == "Rss:":
                    total += int(fields[1])
    except OSError:
        return 0
    return total


def peak_rss_kb() -> int:
    """This process's peak resident set in kilobytes: VmHWM, the high-water mark of its own
    memory map. Not getrusage's ru_maxrss: Linux carries that across exec, so a child of a large
    parent (a pytest worker) reports the parent's peak when its own is smaller."""
    hwm = status_kb("VmHWM").get("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux


def status_kb(*fields: str) -> dict[str, int]:
    """The named kilobyte fields of /proc/self/status (VmRSS, VmHWM, ...); {} where it cannot be read."""
    found = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in fields:
                    found[key] = int(value.split()[0])
    except OSError:
        pass
    return found

if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
