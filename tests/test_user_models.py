"""Your own model: the zoo of examples/ (models the kit never saw, each a ``path.py:make`` file) traced fused and
not, planned by POET at a RAM budget below checkpoint-all's that forces recomputation or paging, and executed
for three steps on one executor: gradients bit-equal to plain autograd after each step, measured peak at or
under the RAM budget (the planner keeps the measured workspace free: ``TrainingGraph.workspace_bytes``). Also
the contract's one-line errors and the CLI on a model file."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import poetlab
from poetlab.core.schedule import OpKind, checkpoint_all_schedule, simulate
from poetlab.errors import InvalidArgumentError
from poetlab.torch.execute import ScheduleExecutor, execute
from poetlab.torch.execute.result import ExecutionError
from poetlab.torch.trace import trace
from poetlab.torch.user_models import load_user_model

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
#: the zoo; the larger ones are slow on 2 shared cores
QUICK = ["tied", "reused", "aux_tuple", "mha", "gru", "audio1d", "groupnorm_dw"]
SLOW = ["unet", "nanogpt"]
ZOO = [pytest.param(name, fuse, id=f"{name}-{'fused' if fuse else 'plain'}") for name in QUICK for fuse in (False, True)] + [
    pytest.param(name, fuse, id=f"{name}-{'fused' if fuse else 'plain'}", marks=pytest.mark.slow) for name in SLOW for fuse in (False, True)
]

pytestmark = pytest.mark.usefixtures("deterministic_torch")


def _plan(graph, costs):
    """POET's schedule at the lowest of 60-95% of checkpoint-all's activations (plus the workspace kept
    free) that makes it recompute or page: (schedule, RAM budget)."""
    full = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    for fraction in (0.6, 0.7, 0.8, 0.9, 0.95):
        budget = fraction * full + graph.workspace_bytes
        result = poetlab.solve(graph, costs, budget, time_limit_s=20)  # (a time-limited schedule is fine: any that fits)
        if result.schedule is not None and (result.schedule.n_recomputes or result.schedule.count(OpKind.PAGE_OUT)):
            return result.schedule, budget
    pytest.fail("no budget below checkpoint-all's makes POET recompute or page")


@pytest.mark.parametrize("name, fuse", ZOO)
def test_the_zoo_trains_as_plain_autograd_within_its_budget(name, fuse):
    model = load_user_model(f"{EXAMPLES / name}.py:make")
    graph = trace(model.module, model.inputs, model.loss_fn, model.targets, fuse=fuse)
    assert not [k for k in vars(model.module) if k.startswith("_tensor_constant")]  # (the module as it was)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    schedule, budget = _plan(graph, costs)
    reference, scheduled = copy.deepcopy(model.module), copy.deepcopy(model.module)
    executor = ScheduleExecutor(scheduled, graph, schedule, model.loss_fn)
    for step in range(3):
        rng = torch.get_rng_state()
        plain = model.loss_fn(reference(model.inputs), model.targets)
        plain.backward()
        torch.set_rng_state(rng)
        result = executor.step(model.inputs, model.targets, measure_memory=True)
        assert result.loss == float(plain.detach())
        for (pname, a), b in zip(reference.named_parameters(), scheduled.parameters(), strict=True):
            assert (a.grad is None) == (b.grad is None), pname
            assert a.grad is None or torch.equal(a.grad, b.grad), f"{name}, step {step + 1}: gradient of {pname} differs"
        assert result.peak_bytes <= budget, (step, result.peak_bytes, budget, graph.workspace_bytes)
    assert result.n_recomputes + result.n_pageouts > 0


def test_nanogpt_as_nanogpt_writes_it_traces_with_no_shape_nodes():
    """``B, T, C = x.size()``, the mask buffer sliced to ``T`` and ``math.sqrt(k.size(-1))``: shapes are
    concrete (no node reads a tensor for its size), the mask buffer a constant read by attribute."""
    model = load_user_model(f"{EXAMPLES}/nanogpt.py:make")
    graph = trace(model.module, model.inputs, model.loss_fn, model.targets)
    assert "size" not in graph.metadata["fx_code"] and "h_0_attn_bias" in graph.metadata["fx_code"]


def test_execute_refuses_a_step_over_its_budget():
    model = load_user_model(f"{EXAMPLES}/tied.py:make")
    graph = trace(model.module, model.inputs, model.loss_fn, model.targets)
    schedule = checkpoint_all_schedule(graph)
    with pytest.raises(ExecutionError, match="over the RAM budget"):
        execute(model.module, schedule, (model.inputs, model.targets), graph=graph, loss_fn=model.loss_fn, ram_budget_bytes=1000)


@pytest.mark.parametrize("spec, message", [
    ("examples/unet.py", "path/to/file.py:FUNCTION"),
    ("examples/missing.py:make", "not found"),
    ("examples/unet.py:nothing", "has no function 'nothing'; functions there: _block, make"),
])
def test_bad_model_specs_are_one_line(spec, message):
    with pytest.raises(InvalidArgumentError, match=message) as info:
        load_user_model(str(REPO / spec) if ":" in spec else str(REPO / spec))
    assert "\n" not in str(info.value)


def test_a_function_returning_the_wrong_thing_is_one_line(tmp_path):
    (tmp_path / "bad.py").write_text("def make():\n    return 1, 2\n\ndef broken():\n    raise KeyError('x')\n")
    with pytest.raises(InvalidArgumentError, match=r"must return \(module, inputs, targets, loss_fn\), got a tuple of 2"):
        load_user_model(f"{tmp_path}/bad.py:make")
    with pytest.raises(InvalidArgumentError, match=r"broken\(\) failed: KeyError"):
        load_user_model(f"{tmp_path}/bad.py:broken")


def test_the_cli_takes_a_model_file(run_cli):
    solved = run_cli("solve", "--model", "examples/tied.py:make", "--platform", "a72", "--ram-budget", "80000", "--time-limit", "5", cwd=REPO)
    assert solved.returncode == 0, solved.stderr
    bad = run_cli("graph", "--model", "examples/tied.py:nope", "--platform", "a72", cwd=REPO)
    assert bad.returncode != 0 and bad.stderr.strip().count("\n") == 0 and "has no function 'nope'" in bad.stderr


def test_host_costs_of_any_model_in_one_call_say_which_they_are():
    """A profile that timed the graph prices each node by its measured time; any other graph is priced by
    flops at the profile's measured rate, and the call says so."""
    from poetlab.torch.host_profile import HostProfile

    profile = HostProfile.load(REPO / "data/profiles/host-resnet18_cifar_torch-fused.json")
    model = load_user_model(f"{EXAMPLES}/tied.py:make")
    graph = trace(model.module, model.inputs, model.loss_fn, model.targets)
    costs, source = poetlab.host_costs(graph, profile)
    assert source == "flops at the measured rate"
    assert costs.runtime_s[1] == pytest.approx(graph.nodes[1].flop / profile.flops_per_s)
    timed = poetlab.trace_torch_model("resnet18_cifar_torch", profile.model.batch_size, fuse=True)
    _, source = poetlab.host_costs(timed, profile)
    assert source == "profiled"
