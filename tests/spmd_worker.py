"""Run as a process by tests/test_spmd.py: simulated CPU devices must never reach the main test
process, so every check on a mesh runs here. Prints one `RESULT {json}` line per scenario.

    python spmd_worker.py DEVICES SCENARIO...            (one process)
    python spmd_worker.py DEVICES multiprocess PID PORT  (one of two jax.distributed processes)
"""
from __future__ import annotations

import copy
import json
import os
import sys

os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={sys.argv[1]}"  # before jax starts
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import torch  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import torchtpu.backend  # noqa: E402,F401 — registers the backend, loads the package in import order
from benchmarks import models  # noqa: E402
from torchtpu import events, spmd  # noqa: E402
from torchtpu.runtime import residency  # noqa: E402

TP = {"mesh": {"dp": 2, "tp": 4}, "tp_plan": "auto"}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def compile_with(model, options):
    torch._dynamo.reset()
    return torch.compile(model, backend="tpu", fullgraph=True, options=options)


def spmd_events() -> list[dict]:
    return [e for e in events.events() if e["kind"] == "spmd"]


def resident_shard_bytes(model, event, mesh) -> dict:
    """Per parameter of the event: (whole bytes, [bytes on each device]) of its resident copy."""
    params = dict(model.named_parameters())
    out = {}
    for name, entry in event["params"].items():
        if name not in params:
            continue
        sharding = NamedSharding(mesh, P(*entry["spec"]))
        array = residency.resident(params[name], sharding, put=lambda t: None)  # a miss returns None
        shards = None if array is None else sorted(s.data.nbytes for s in array.addressable_shards)
        out[name] = {"spec": entry["spec"], "whole": params[name].nbytes, "shards": shards}
    return out


def tp_inference() -> dict:
    torch.manual_seed(0)
    model = models.hf_llama()
    ids = torch.randint(0, 256, (2, 16))
    events.clear()
    with torch.no_grad():
        expected = model(ids).logits
        compiled = compile_with(model, TP)
        first = compiled(ids).logits
        placed = residency.size()
        second = compiled(torch.randint(0, 256, (2, 16)))  # new data, same weights: nothing re-placed
    (event,) = spmd_events()
    mesh = spmd.build_mesh(spmd.parse_mesh(TP["mesh"]), jax.devices())
    return {"rel_error": rel(first, expected), "sum": first.double().sum().item(), "resident_after_first": placed,
            "resident_after_second": residency.size(), "second_ok": bool(torch.isfinite(second.logits).all()),
            "collectives": event["collectives"], "inputs": event["inputs"], "mesh": event["mesh"],
            "params": resident_shard_bytes(model, event, mesh)}


def tp_train() -> dict:
    torch.manual_seed(0)
    eager = models.hf_llama().train()
    compiled_model = copy.deepcopy(eager)
    ids = torch.randint(0, 256, (4, 16))
    loss = eager(ids).logits.float().pow(2).mean()
    loss.backward()
    events.clear()
    compiled_loss = compile_with(compiled_model, TP)(ids).logits.float().pow(2).mean()
    compiled_loss.backward()
    grads = {n: rel(p.grad, q.grad)
             for (n, q), (_, p) in zip(eager.named_parameters(), compiled_model.named_parameters())}
    return {"loss_rel_error": rel(compiled_loss.detach(), loss.detach()), "grad_rel_errors": grads,
            "graphs": {e["graph"].split("_")[0]: e["collectives"] for e in spmd_events()}}


class TinyLM(torch.nn.Module):
    """Embedding -> MLP -> head, with biases: a plan by dict, over one tp axis of all devices."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(64, 32)
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)
        self.head = torch.nn.Linear(32, 64)

    def forward(self, ids):
        logits = self.head(self.down(torch.relu(self.up(self.emb(ids)))))
        return logits, logits.argmax(-1)


def dict_plan() -> dict:
    torch.manual_seed(0)
    model = TinyLM()
    ids = torch.randint(0, 64, (3, 5))
    options = {"mesh": {"tp": -1}, "tp_plan": {"emb": "rowwise", "up": "colwise", "down": "rowwise",
                                                "head": "replicate"}}
    events.clear()
    with torch.no_grad():
        logits, best = model(ids)
        got_logits, got_best = compile_with(model, options)(ids)
    (event,) = spmd_events()
    mesh = spmd.build_mesh(spmd.parse_mesh(options["mesh"]), jax.devices())
    return {"rel_error": rel(got_logits, logits), "argmax_equal": bool(torch.equal(got_best, best)),
            "argmax_dtype": str(got_best.dtype), "mesh": event["mesh"],
            "params": resident_shard_bytes(model, event, mesh)}


def errors() -> dict:
    out = {}
    for label, model, options in [
        ("too_many_devices", torch.nn.Linear(4, 4), {"mesh": {"dp": 16}}),
        ("auto_without_plan", torch.nn.Linear(4, 4), {"mesh": {"tp": 2}, "tp_plan": "auto"}),
    ]:
        try:
            compile_with(model, options)(torch.randn(2, 4))
            out[label] = None
        except Exception as exc:  # noqa: BLE001 — the message is what the test checks
            out[label] = str(exc)
    return out


def export_tpu() -> dict:
    import torchtpu

    torch.manual_seed(0)
    model = TinyLM()
    exported = torchtpu.export(model, torch.randint(0, 64, (4, 5)), platforms=("tpu",),
                               options={"mesh": {"dp": 2, "tp": 4}, "tp_plan": {"up": "colwise", "down": "rowwise"}})
    main = next(line for line in exported.stablehlo_text().splitlines() if "func.func public @main" in line)
    return {"nr_devices": exported.programs[0].nr_devices, "platforms": list(exported.programs[0].platforms),
            "main_signature": main}


def deviceless_tpu() -> dict:
    """The HF decoder for a 4-chip TPU topology (libtpu, no TPU attached): compiled, not run."""
    from torchtpu.runtime.executable import NotRunnableHere
    from torchtpu.runtime.target import deviceless_tpu as on_topology

    torch.manual_seed(0)
    events.clear()
    with on_topology("v5e:2x2"), torch.no_grad():
        try:
            compile_with(models.hf_llama(), {"mesh": {"dp": 2, "tp": 2}, "tp_plan": "auto"})(
                torch.randint(0, 256, (2, 128)))
            ran = True
        except NotRunnableHere:
            ran = False
    (event,) = spmd_events()
    kernels = {e["choice"] for e in events.events() if e["kind"] == "kernel"}
    return {"ran": ran, "platform": event["platform"], "mesh": event["mesh"], "collectives": event["collectives"],
            "q_proj": event["params"]["model.layers.0.self_attn.q_proj.weight"]["spec"], "kernels": sorted(kernels)}


def multiprocess(pid: int, port: int) -> dict:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    torch.manual_seed(0)
    model = models.hf_llama()
    ids = torch.randint(0, 256, (2, 16))  # the same seed: every process feeds the same global batch
    with torch.no_grad():
        expected = model(ids).logits
        got = compile_with(model, TP)(ids).logits
    return {"process": jax.process_index(), "processes": jax.process_count(), "devices": len(jax.devices()),
            "local_devices": len(jax.local_devices()), "rel_error": rel(got, expected),
            "sum": got.double().sum().item()}


def executable_per_device() -> dict:
    """One program compiled for each of two devices, each called three times: the later calls
    go through the result handlers the first one kept, and every result stays on its device."""
    import jax.numpy as jnp
    import numpy as np

    from torchtpu.layout import OutputSlot, ProgramLayout
    from torchtpu.runtime import transfer
    from torchtpu.runtime.executable import Executable

    x = torch.arange(6, dtype=torch.float32)
    layout = ProgramLayout([0], False, [OutputSlot("tensor", 0), OutputSlot("tensor", 1)])
    out = {}
    for device in jax.devices()[:2]:
        one = jax.sharding.SingleDeviceSharding(device)
        compiled = jax.jit(lambda a: (a * 2 + 1, a.sum()), in_shardings=one, out_shardings=one,
                           keep_unused=True).lower(jax.ShapeDtypeStruct((6,), jnp.float32)).compile()
        exe = Executable(compiled._executable.xla_executable, layout, device)
        calls = [exe.run_arrays([transfer.to_device(x, device)]) for _ in range(3)]
        out[str(device)] = {"devices": [sorted(str(d) for a in results for d in a.devices()) for results in calls],
                            "values": [[np.asarray(a).tolist() for a in results] for results in calls],
                            "torch": [t.tolist() for t in exe.run([x])]}
    return {"executables": out}


def main() -> None:
    if sys.argv[2] == "multiprocess":
        _emit(multiprocess(int(sys.argv[3]), int(sys.argv[4])))
        return
    for scenario in sys.argv[2:]:
        _emit({"scenario": scenario, **globals()[scenario]()})


def _emit(result: dict) -> None:
    # One write with its newline: gloo's threads print to the same stdout.
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
