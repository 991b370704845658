"""Warm start without tracing: torchtpu.precompile.save in one process, load in another.

A fresh process must run the saved programs without Dynamo, AOTAutograd or XLA (inference,
training, a symbolic length); anything that makes an artifact unusable (other versions,
changed model code, another model, a damaged or untrusted file, inputs outside its guards)
warns once and compiles normally, with the right numbers.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import helpers
import torchtpu
from precompile_models import MLP, Scaled, llama, loss_fn
from torchtpu.precompile.artifact import Artifact

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """llama.tpu, train.tpu, dynamic.tpu and bf16.tpu saved by this process, with its compile cache."""
    folder = tmp_path_factory.mktemp("precompiled")
    model = llama()
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    torchtpu.precompile.save(model, (ids,), folder / "llama.tpu")
    torchtpu.precompile.save(loss_fn, (model, ids), folder / "train.tpu")
    dynamic_ids = ids.clone()
    torch._dynamo.mark_dynamic(dynamic_ids, 1)
    with torch.no_grad():  # grad mode is guarded: saved as it will be called
        torchtpu.precompile.save(model, (dynamic_ids,), folder / "dynamic.tpu")
        torchtpu.precompile.save(llama().to(torch.bfloat16), (ids,), folder / "bf16.tpu")
    return folder


def test_a_fresh_process_runs_precompiled_programs_without_tracing_or_compiling(saved):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
    proc = subprocess.run([sys.executable, str(HERE / "precompile_worker.py"), str(saved)], cwd=HERE, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["loaded"] == [True, True, True, True] and out["warnings"] == [], out["warnings"]  # why refused
    for stage in ("after_inference", "after_train"):  # static graphs: every executable from the cache
        assert out[stage]["dynamo_graphs"] == 0 and out[stage]["aot_graphs"] == 0, out[stage]
        assert out[stage]["xla_compiles"] == 0, out[stage]
    assert out["after_train"]["disk_hits"] >= 3  # inference, then the training forward and backward
    assert out["inference_error"] < 1e-5
    assert out["train_grad_error"] < 1e-6
    # the symbolic graph is rebuilt from the artifact: no Dynamo either; lengths 5 and 27 are new buckets
    assert out["after_dynamic"]["dynamo_graphs"] == 0 and out["after_dynamic"]["aot_graphs"] == 0
    assert max(out["dynamic_errors"]) < 1e-5
    # bfloat16: the cached executable, no compile; no worse than eager bfloat16 against float32
    assert out["after_bf16"]["xla_compiles"] == out["after_dynamic"]["xla_compiles"]
    assert out["after_bf16"]["dynamo_graphs"] == out["after_dynamic"]["dynamo_graphs"]
    assert out["bf16_error_vs_f32"] <= 2 * out["eager_bf16_error_vs_f32"] + 1e-2, out


def _load_warning(path, model=None, **kwargs) -> tuple[torchtpu.precompile.Precompiled, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = torchtpu.precompile.load(path, model, **kwargs)
    return run, [str(w.message) for w in caught if "torchtpu" in str(w.message)]


@pytest.fixture
def mlp_artifact(tmp_path):
    model = MLP()
    x = torch.randn(3, 8)
    path = torchtpu.precompile.save(model, (x,), tmp_path / "mlp.tpu")
    return path, model, x


def _rewrite(path, **header):
    art = Artifact.read(path)
    art.header.update(header)
    path.write_bytes(art.to_bytes())


@pytest.mark.parametrize("damage", ["versions", "payload_byte", "truncated", "not_an_artifact", "missing"])
def test_an_unusable_artifact_warns_once_and_compiles_instead(mlp_artifact, damage):
    path, model, x = mlp_artifact
    if damage == "versions":
        _rewrite(path, versions={**Artifact.read(path).header["versions"], "jax": "0.0.1"})
    elif damage == "payload_byte":
        data = bytearray(path.read_bytes())
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-1000])
    elif damage == "not_an_artifact":
        path.write_bytes(b"PK\x03\x04 not ours")
    else:
        path.unlink()
    run, said = _load_warning(path, model)
    expected = {"versions": "jax 0.0.1 ->", "payload_byte": "checksum", "truncated": "checksum",
                "not_an_artifact": "not a torchtpu precompiled artifact", "missing": "No such file"}[damage]
    assert not run.loaded and len(said) == 1 and expected in said[0], said
    torch.testing.assert_close(run(x), model(x))
    torch.testing.assert_close(run(x * 2), model(x * 2))
    assert torchtpu.stats()["precompiled_refused"] >= 1


def test_an_artifact_others_can_write_is_not_loaded(mlp_artifact):
    path, model, x = mlp_artifact
    os.chmod(path, 0o666)
    run, said = _load_warning(path, model)
    assert not run.loaded and "writable by other users" in said[0]
    torch.testing.assert_close(run(x), model(x))


def test_inputs_outside_the_guards_compile_with_one_warning(mlp_artifact):
    path, model, x = mlp_artifact
    run, said = _load_warning(path, model)
    assert run.loaded and said == []
    torch.testing.assert_close(run(x), model(x))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for other in (torch.randn(5, 8), torch.randn(3, 8, dtype=torch.float64), torch.randn(7, 8)):
            torch.testing.assert_close(run(other), model.double()(other) if other.dtype == torch.float64
                                       else model.float()(other))
            model.float()
    said = [str(w.message) for w in caught if "torchtpu" in str(w.message)]
    assert len(said) == 1 and "miss the artifact's guards" in said[0]


def test_a_changed_model_setting_misses_the_guards_and_compiles(tmp_path):
    model, x = Scaled(2.0), torch.randn(3, 8)
    path = torchtpu.precompile.save(model, (x,), tmp_path / "scaled.tpu")
    model.scale = 3.0  # same class and parameters: only the guards can tell
    run, said = _load_warning(path, model)
    assert run.loaded and said == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(run(x), model(x))
    assert any("miss the artifact's guards" in str(w.message) for w in caught)


def test_another_model_is_refused(mlp_artifact):
    path, _, x = mlp_artifact
    other = MLP(hidden=32)
    run, said = _load_warning(path, other)
    assert not run.loaded and "another model" in said[0]
    torch.testing.assert_close(run(x), other(x))


def test_changed_model_code_is_refused(tmp_path, monkeypatch):
    source = tmp_path / "changing_model.py"
    source.write_text("import torch\n\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n"
                      "        super().__init__()\n        self.lin = torch.nn.Linear(4, 4)\n\n"
                      "    def forward(self, x):\n        return self.lin(x) * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("changing_model")
    model, x = module.Net(), torch.randn(2, 4)
    path = torchtpu.precompile.save(model, (x,), tmp_path / "net.tpu")
    assert torchtpu.precompile.load(path, model).loaded
    source.write_text(source.read_text().replace("* 2", "* 3  # changed"))
    module = importlib.reload(module)
    fresh = module.Net()
    fresh.load_state_dict(model.state_dict())
    run, said = _load_warning(path, fresh)
    assert not run.loaded and "code changed: changing_model lines" in said[0], said
    torch.testing.assert_close(run(x), fresh(x))  # the new code's numbers, not the artifact's


def test_save_of_a_failing_model_writes_nothing(tmp_path):
    def broken(x):
        return torch.nonzero(x).sum() + x.item()  # a graph break: not one whole graph

    with pytest.raises(Exception):
        torchtpu.precompile.save(broken, (torch.randn(3),), tmp_path / "broken.tpu")
    assert list(tmp_path.iterdir()) == []


def test_a_mesh_program_is_refused_with_its_reason(tmp_path):
    with pytest.raises(Exception, match="device mesh cannot be precompiled"):
        torchtpu.precompile.save(MLP(), (torch.randn(2, 8),), tmp_path / "mesh.tpu", options={"mesh": {"dp": 1}})


def _with_host_op(x):
    return torch.relu(helpers.host_triple(torch.sin(x) + 1)) * 2


def test_a_graph_with_a_host_op_precompiles_and_reloads(tmp_path):
    """A DeferAndFuse graph (an op with no rule runs on the host between device programs) is
    rebuilt through the driver on load: the same regions, the same numbers."""
    x = torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the HostFallbackWarning of the save's compile
        path = torchtpu.precompile.save(_with_host_op, (x,), tmp_path / "host.tpu")
    before = torchtpu.stats()
    run, said = _load_warning(path)
    assert run.loaded and said == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(run(x), _with_host_op(x))
    after = torchtpu.stats()
    assert after["device_regions"] > before["device_regions"]  # rebuilt as regions again
    assert after.get("precompiled_fallback_calls", 0) == before.get("precompiled_fallback_calls", 0)



def test_a_model_saved_after_other_model_classes_loads_where_they_were_never_built(tmp_path):
    """transformers registers each model class it builds in a global dict, and the traced forward
    reads it by key. A process that built other classes first (here: two stand-ins ahead of the
    Llama's) must still write an artifact that a process without them loads."""
    from transformers.utils import output_capturing

    registry = output_capturing._CAN_RECORD_REGISTRY
    model, ids = llama(), torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    before = dict(registry)
    try:
        registry.clear()
        dict.update(registry, {"<class 'other.One'>": {}, "<class 'other.Two'>": {}}, **before)
        with torch.no_grad():
            path = torchtpu.precompile.save(model, (ids,), tmp_path / "llama.tpu")
    finally:
        registry.clear()
        dict.update(registry, before)
    run, said = _load_warning(path, model)
    assert run.loaded and said == [], said
    with torch.no_grad():
        torch.testing.assert_close(run(ids).logits, model(ids).logits)


def _layer_class():
    """A module class made by a factory, as transformers 5.25's hub-kernel layers are."""

    class Layer(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(x) * 2

    return Layer


class WithMadeLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.act = torch.nn.Linear(8, 8), _layer_class()()

    def forward(self, x):
        return self.act(self.lin(x))


def _train_loss(model, x):
    return model(x).pow(2).mean()


def test_a_layer_of_a_class_made_in_a_function_saves_its_training_graphs(tmp_path):
    """A layer whose class is local to a function does not pickle; the backward's nodes name it
    in `fwd_nn_module_stack`, metadata nothing below the backend reads, which the saved graph
    leaves out (torch's filter drops only the forward's stacks)."""
    model, x = WithMadeLayer(), torch.randn(4, 8)
    path = torchtpu.precompile.save(_train_loss, (model, x), tmp_path / "made.tpu")
    run, said = _load_warning(path)
    assert run.loaded and said == []
    run(model, x).backward()
    got = model.lin.weight.grad.clone()
    model.zero_grad()
    _train_loss(model, x).backward()
    torch.testing.assert_close(got, model.lin.weight.grad)


def test_a_swapped_submodule_class_is_another_model(tmp_path):
    """The guards on a made class's type are dropped (above): the header's model signature names
    every submodule's class, so a model whose layer is another class is refused."""
    model, x = WithMadeLayer(), torch.randn(4, 8)
    path = torchtpu.precompile.save(model, (x,), tmp_path / "made.tpu")
    assert torchtpu.precompile.load(path, model).loaded
    model.act = torch.nn.Tanh()  # the same parameters
    run, said = _load_warning(path, model)
    assert not run.loaded and "another model" in said[0], said
    torch.testing.assert_close(run(x), model(x))
