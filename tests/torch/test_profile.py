"""The host profile: real files, real timings, real torch; and its errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import poetlab.torch.kernels
from poetlab import CostModel, InvalidArgumentError, trace
from poetlab.torch.host_profile import HostProfile, ProfileFileError
from poetlab.torch.profile import (
    PagingDirError,
    check_paging_dir,
    profile_disk,
    profile_host,
    profile_model,
)

SMALL_SIZES = (1 << 16, 1 << 18, 1 << 20)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1, self.relu, self.lin2 = nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)

    def forward(self, x):
        h = self.relu(self.lin1(x))
        return self.lin2(h) + h[:, :4]


@pytest.fixture(scope="module")
def host_profile(tmp_path_factory) -> HostProfile:
    return profile_host(tmp_path_factory.mktemp("paging"), model="bert_small_torch", repeats=1, warmup=0, disk_sizes_bytes=SMALL_SIZES, disk_repeats=1)


def test_disk_profile_reads_back_what_it_wrote(tmp_path):
    disk = profile_disk(tmp_path, SMALL_SIZES, repeats=1)
    assert disk.sizes_bytes == SMALL_SIZES and len(disk.pageout_s) == len(disk.pagein_s) == 3
    assert disk.pageout_throughput_bytes_per_s > 0 and disk.pagein_throughput_bytes_per_s > 0
    assert disk.pageout_latency_s >= 0 and disk.pagein_latency_s >= 0
    assert disk.cache_bypass and disk.energy_source in ("rapl", "model")
    assert list(tmp_path.iterdir()) == []  # the benchmark file is removed


def test_disk_profile_measures_the_executors_paging(tmp_path, monkeypatch):
    """The disk benchmark pages through the executor's own PageStore (what the prediction must price),
    and a disk that fills up mid-benchmark is one line naming the fix, with nothing left behind."""
    import errno
    import os

    from poetlab.torch.paging import PageStore

    writes = []
    real_write = PageStore.write
    monkeypatch.setattr(PageStore, "write", lambda self, key, storages: (writes.append(sum(s.nbytes() for s in storages)), real_write(self, key, storages)))
    disk = profile_disk(tmp_path, SMALL_SIZES, repeats=1)
    assert writes == [size for size in SMALL_SIZES for _ in range(2)]  # (a warm-up and one timed, per size)
    assert list(tmp_path.iterdir()) == []  # (the store's private directory is gone too)
    with PageStore(tmp_path) as store:
        assert disk.cache_bypass == store.cache_bypass
    real_open = os.open

    def full(path, *args, **kwargs):  # (the page files only: the directory checks before still pass)
        if str(path).endswith(".bin"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", full)
    with pytest.raises(PagingDirError) as caught:
        profile_disk(tmp_path, SMALL_SIZES, repeats=1)
    assert "\n" not in str(caught.value) and "No space left on device" in str(caught.value) and "free disk space" in str(caught.value)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_profile_round_trip_and_costs(host_profile, tmp_path):
    path = host_profile.save(tmp_path / "host.json")
    loaded = HostProfile.load(path)
    assert loaded == host_profile
    assert loaded.machine.torch_version == torch.__version__ and loaded.machine.torch_threads == 1
    # the kernels the model was timed on, as the executor runs them (NOTE [kernel choice] in poetlab.torch.kernels)
    assert loaded.machine.cpu_capability == torch.backends.cpu.get_cpu_capability()
    assert loaded.machine.convolution_kernels == poetlab.torch.kernels.CONVOLUTION_KERNELS
    assert loaded.energy_modeled == (loaded.energy_source == "model")
    assert loaded.clock == "cpu"  # one thread: the thread's CPU time, immune to waiting for a shared core
    model = loaded.model
    from poetlab import trace_torch_model

    graph = trace_torch_model("bert_small_torch")
    assert [n.name for n in model.nodes] == [n.name for n in graph.nodes]
    assert all(n.runtime_s > 0 for n, g in zip(model.nodes, graph.nodes) if g.kind != "input")
    raw = CostModel.from_profile(graph, loaded, calibrate=False)
    assert raw.runtime_s.sum() == pytest.approx(model.node_runtime_sum_s)
    assert raw.runtime_s.tolist() == [n.runtime_s for n in model.nodes]
    # calibrated (the default): one factor per model, so that a plain step is the measured whole step
    costs = CostModel.from_profile(graph, loaded)
    assert costs.plain_step_runtime_s == pytest.approx(model.step_runtime_s)
    # forward nodes at the measured forward pass's rate, backward nodes at the rest of the step's
    backward = np.array([node.is_backward for node in graph.nodes])
    assert 0 < model.forward_runtime_s < model.step_runtime_s
    assert costs.runtime_s[~backward].sum() == pytest.approx(model.forward_runtime_s)
    assert costs.runtime_s[backward].sum() == pytest.approx(model.step_runtime_s - model.forward_runtime_s)
    ratio = np.divide(costs.compute_energy_j, raw.compute_energy_j, out=np.ones(graph.n_nodes), where=raw.compute_energy_j > 0)
    assert np.allclose(ratio[raw.runtime_s > 0], (costs.runtime_s / np.where(raw.runtime_s > 0, raw.runtime_s, 1))[raw.runtime_s > 0])
    # an older profile without the forward pass's time: one factor for all nodes
    older = CostModel.from_profile(graph, HostProfile.from_dict({**loaded.to_dict(), "model": {**loaded.to_dict()["model"], "forward_runtime_s": None}}))
    assert np.allclose(older.runtime_s, raw.runtime_s * model.step_runtime_s / model.node_runtime_sum_s)
    # reruns: each forward node (not the input, not the loss) was also timed rerun in the middle of a
    # backward pass of a whole step, and a recompute is priced at that time as it is (calibrated or not),
    # its energy at the node's probed power; the other nodes' reruns at their (calibrated) compute
    timed = np.array([g.kind not in ("input", "loss") and not g.is_backward for g in graph.nodes])
    assert [n.rerun_s is not None for n in model.nodes] == timed.tolist()
    assert all(len(n.rerun_samples_s) == loaded.repeats and n.rerun_s > 0 for n in model.nodes if n.rerun_s is not None)
    reruns = np.array([n.rerun_s for n, t in zip(model.nodes, timed) if t])
    for priced in (costs, raw, older):
        assert np.allclose(priced.recompute_runtime_s[timed], reruns)
        assert np.array_equal(priced.recompute_runtime_s[~timed], priced.runtime_s[~timed])
    power = np.array([n.energy_j / n.runtime_s for n, t in zip(model.nodes, timed) if t])
    assert np.allclose(costs.recompute_energy_j[timed], reruns * power)
    untimed = {**loaded.to_dict()["model"], "nodes": [{**n, "rerun_s": None, "rerun_samples_s": []} for n in loaded.to_dict()["model"]["nodes"]]}
    assert np.array_equal(CostModel.from_profile(graph, HostProfile.from_dict({**loaded.to_dict(), "model": untimed})).recompute_runtime_s, costs.runtime_s)
    # a version 1 profile took its rerun times another way (grad off, interpreted): read without them
    first = HostProfile.from_dict({**loaded.to_dict(), "version": 1})
    assert all(n.rerun_s is None and n.rerun_samples_s == () for n in first.model.nodes)
    assert np.array_equal(CostModel.from_profile(graph, first).recompute_runtime_s, costs.runtime_s)
    assert np.array_equal(costs.pagein_time_s, raw.pagein_time_s)  # paging is measured on its own, not scaled
    assert np.all(costs.pageout_time_s > 0) and costs.platform == "host"
    by_flops = CostModel.from_flops(trace_torch_model("bert_small_torch", fuse=True), loaded.platform())
    assert by_flops.runtime_s.sum() > 0
    with pytest.raises(InvalidArgumentError, match="run `poetlab profile --platform host --model"):
        CostModel.from_profile(trace_torch_model("bert_small_torch", fuse=True), loaded)


def test_profile_with_negative_numbers_is_refused(host_profile, tmp_path):
    data = host_profile.to_dict()
    data["flops_per_s"] = -1.0
    path = tmp_path / "neg.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileFileError, match="must be positive"):
        HostProfile.load(path)
    data = host_profile.to_dict()
    next(n for n in data["model"]["nodes"] if n["rerun_s"] is not None)["rerun_s"] = -1e-3
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileFileError, match="must be positive"):
        HostProfile.load(path)
    with pytest.raises(ProfileFileError, match="no such host profile"):
        HostProfile.load(tmp_path / "missing.json")


def test_profile_model_times_every_node_and_leaves_the_module(tmp_path):
    torch.manual_seed(0)
    module = Tiny()
    x, y = torch.randn(8, 16), torch.randint(4, (8,))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    graph, timed = profile_model(module, x, nn.CrossEntropyLoss(), y, name="tiny", batch_size=8, repeats=2, warmup=1)
    assert graph == trace(module, x, nn.CrossEntropyLoss(), y, name="tiny")
    assert [n.name for n in timed.nodes] == [n.name for n in graph.nodes]
    assert all(len(n.samples_s) == 2 for n, g in zip(timed.nodes, graph.nodes) if g.kind != "input")
    reruns = [len(n.rerun_samples_s) for n, g in zip(timed.nodes, graph.nodes) if not g.is_backward and g.kind not in ("input", "loss")]
    assert reruns == [2] * 5  # lin1, relu, lin2, the slice, the sum: each rerun in both timed steps
    assert timed.step_runtime_s > 0
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert all(p.grad is None for p in module.parameters())


class Spied(nn.Module):
    """Tiny's shape, its middle layer noting how it is called: in a backward pass or not, with grad on or
    off, with saved-tensor hooks on or not."""

    def __init__(self):
        super().__init__()
        self.lin1, self.lin2, self.lin3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)
        self.calls: list[tuple[bool, bool, bool]] = []
        self.lin2.register_forward_pre_hook(lambda *_: self.calls.append(
            (torch._C._current_autograd_node() is not None, torch.is_grad_enabled(), torch._C._autograd._top_saved_tensors_default_hooks(False) is not None)
        ))

    def forward(self, x):
        return self.lin3(torch.relu(self.lin2(torch.relu(self.lin1(x)))))


def test_the_rerun_probe_reruns_a_node_as_the_executor_does():
    """Each forward node is rerun in the middle of a backward pass with grad on and what autograd saves
    collected (the executor's rerun, not a forward pass under the backward pass's grad mode, off), in one
    step of every ``stride``: ``repeats`` samples each, from ``(warmup + repeats) * stride`` whole steps."""
    from poetlab.torch.profile import rerun_samples
    from poetlab.torch.trace import trace_step

    torch.manual_seed(0)
    module = Spied()
    x, y = torch.randn(8, 16), torch.randint(4, (8,))
    traced = trace_step(module, (x,), nn.CrossEntropyLoss(), y, fuse=False, name="spied")
    for stride in (1, 2):
        module.calls.clear()
        samples = rerun_samples(traced, (x,), nn.CrossEntropyLoss(), y, repeats=3, warmup=1, clock="cpu", stride=stride)
        in_backward = [call for call in module.calls if call[0]]
        assert len(in_backward) == 3 + 1 and all(grad and hooked for _, grad, hooked in in_backward)
        assert len(module.calls) - len(in_backward) == (3 + 1) * stride  # (the whole steps' forward passes)
        assert samples and all(len(times) == 3 for times in samples.values())


def test_paging_dir_errors(tmp_path, monkeypatch):
    with pytest.raises(PagingDirError, match="does not exist"):
        check_paging_dir(tmp_path / "nope", 1)
    with pytest.raises(PagingDirError, match="is not writable"):
        check_paging_dir("/proc", 1)
    import poetlab.torch.profile as profile_module

    monkeypatch.setattr(profile_module.shutil, "disk_usage", lambda path: type("U", (), {"free": 1000})())
    with pytest.raises(PagingDirError, match="has 1,000 bytes free, the disk benchmark needs"):
        profile_disk(tmp_path, SMALL_SIZES)
