"""DeferAndFuse: host ops between device work, region counts, strict mode, fallback="error"."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo
from torch.fx.experimental.proxy_tensor import make_fx

import torchtpu
from helpers import assert_close_tree, compile_tpu, host_triple as triple
from torchtpu import events
from torchtpu.compiler.errors import LoweringError
from torchtpu.options import Options
from torchtpu.passes import defer_and_fuse as daf
from torchtpu.runtime.fused import HostFallbackWarning

pytestmark = pytest.mark.filterwarnings("ignore::torchtpu.runtime.fused.HostFallbackWarning")

CAPTURE = dict(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True)




def host_in_the_middle(x):
    a = torch.sin(x) * 2
    k = (a > 0).sum().item()            # host sync: an unbacked int
    nz = torch.nonzero(x > 0.5)         # data-dependent shape
    b = torch.cos(x) + 1                # independent of both host ops: hoisted into region 0
    c = triple(b)                       # no lowering rule
    return a * k + c, nz.float().sum(0) + a.sum()


def chained(x):
    """Every host op needs the device work before it: nothing can be hoisted."""
    k = (torch.sin(x) > 0).sum().item()
    y = triple(torch.cos(x) * k)
    return y.exp()


def _last_event(kind="defer_and_fuse"):
    return [e for e in events.events() if e["kind"] == kind][-1]


@pytest.mark.parametrize("fullgraph", [True, False])
def test_host_ops_between_device_work_match_eager(fullgraph):
    torchtpu.reset_stats()
    with torch._dynamo.config.patch(**CAPTURE):
        f = compile_tpu(host_in_the_middle, fullgraph=fullgraph)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for seed in (0, 1):  # new k and a new nonzero count: regions after them run per size
                x = torch.randn(16, generator=torch.Generator().manual_seed(seed))
                assert_close_tree(f(x), host_in_the_middle(x))
    ours = [w for w in caught if issubclass(w.category, HostFallbackWarning)]
    if fullgraph:
        assert len(ours) == 1
        for op in ("aten._local_scalar_dense", "aten.nonzero", "torchtpu_test.triple"):
            assert op in str(ours[0].message)
    else:
        assert not ours
    event = _last_event()
    # region 0: sin, mul, gt, sum, gt(0.5), cos, add; host: item, nonzero, triple;
    # region 1: a * k + c and the nonzero reduction. Two is what the dependencies require.
    assert event["device_regions"] == 2
    # Program order cuts at each host op: [sin..sum] item [gt] nonzero [cos, add] triple [rest].
    assert event["naive_regions"] == 4
    stats = torchtpu.stats()
    assert stats["device_regions"] == 2 and stats["fallback_ops"] == 3
    # Per call: sum, gt and b go to host ops (3); nonzero's and triple's results come back (2).
    assert stats["transfers"] == 2 * 5


def test_no_hoisting_possible_keeps_one_region_per_host_op():
    with torch._dynamo.config.patch(**CAPTURE):
        x = torch.randn(12)
        assert_close_tree(compile_tpu(chained)(x), chained(x))
    event = _last_event()
    # sin/gt/sum -> item -> cos/mul -> triple -> exp: three regions, the same as program order.
    assert event["device_regions"] == event["naive_regions"] == 3


def test_partition_places_independent_work_in_the_first_region():
    x = torch.randn(16)
    with torch._dynamo.config.patch(**CAPTURE):
        gm = make_fx(host_in_the_middle, tracing_mode="symbolic")(x)
    plan = daf.partition(gm)
    where = {n.target: r.index for r in plan.regions for n in r.nodes}
    assert where[torch.ops.aten.cos.default] == 0 and where[torch.ops.aten.sin.default] == 0
    assert plan.naive_regions > len(plan.regions) == 2
    hosts = [s for kind, s in plan.steps if kind == "host" and plan.kinds[s] == daf.HOST]
    assert {str(h.target) for h in hosts} == set(plan.host_ops)
    # Every host op runs after region 0 and before region 1 (deferred to its first user).
    kinds = [kind for kind, _ in plan.steps]
    first, second = kinds.index("region"), len(kinds) - 1 - kinds[::-1].index("region")
    assert all(first < plan.steps.index(("host", h)) < second for h in hosts)


def test_strict_mode_one_program_per_op_matches_eager():
    torchtpu.reset_stats()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(5, 8)
    with torch.no_grad():
        out = compile_tpu(model, options={"mode": "strict"})(x)
        assert_close_tree(out, model(x))
    event = _last_event()
    assert event["mode"] == "strict" and event["host_ops"] == []
    assert event["device_regions"] == len(event["region_sizes"]) >= 5
    assert set(event["region_sizes"]) == {1}


def test_strict_mode_with_host_ops_matches_eager():
    with torch._dynamo.config.patch(**CAPTURE):
        x = torch.randn(16)
        assert_close_tree(compile_tpu(host_in_the_middle, options={"mode": "strict"})(x), host_in_the_middle(x))
    event = _last_event()
    assert event["device_regions"] > 2 and len(event["host_ops"]) == 3


def test_fallback_error_names_the_op_node_and_source(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHTPU_DUMP_DIR", str(tmp_path))
    with torch._dynamo.config.patch(**CAPTURE), pytest.raises(Exception) as info:
        compile_tpu(lambda x: triple(x.sin()) + 1, options={"fallback": "error"})(torch.randn(4))
    text = str(info.value)
    assert "no lowering for torchtpu_test.triple.default" in text
    assert "FX node: %triple" in text and "test_defer_and_fuse.py" in text
    chain, err = [], info.value
    while err is not None:
        chain.append(err)
        err = err.__cause__ or getattr(err, "inner_exception", None)  # Dynamo wraps backend errors
    assert any(isinstance(e, LoweringError) for e in chain)


def test_fallback_error_on_a_data_dependent_shape():
    with torch._dynamo.config.patch(**CAPTURE), pytest.raises(Exception, match="aten.nonzero.default"):
        compile_tpu(lambda x: torch.nonzero(x > 0).sum(), options={"fallback": "error"})(torch.randn(6))


def test_graph_without_host_ops_is_one_program():
    torchtpu.reset_stats()
    x = torch.randn(6)
    assert_close_tree(compile_tpu(lambda x: x.sin() * 2)(x), x.sin() * 2)
    assert torchtpu.stats()["device_regions"] == 0  # not partitioned at all


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="fallback='eager'; use 'defer' or 'error'"):
        Options.parse({"fallback": "eager"})
    with pytest.raises(ValueError, match="mode='lazy'; use 'fused' or 'strict'"):
        Options.parse({"mode": "lazy"})
