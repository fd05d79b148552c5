"""The forward nodes of a step: first runs, reruns on the same RNG state and buffers (NOTE [3]), graphless first runs (NOTE [6]) and the loss. See docs/executor.md."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import fx

from poetlab.torch.probes import fetch_attr, tensors_in
from poetlab.torch.execute.graphless import GraphlessRun, detached_aliases
from poetlab.torch.execute.result import ExecutionError
from poetlab.torch.execute.state import MISSING, copy_buffers, storage_key, pop_saved_hooks, push_saved_hooks, set_versions, storages_of, never_unpacked


class StepComputing:
    """The step's forward nodes: first runs, reruns (NOTE [3], [6]) and the loss; a mixin of :class:`StepRun`."""

    __slots__ = ()

    # -- forward nodes --------------------------------------------------------------------------
    def _resolve(self, dep: fx.Node, local: dict[str, object], detach: bool, reader: str) -> object:
        if dep.name in local:
            return local[dep.name]
        group = self.layout.group_of.get(dep.name)
        if group is not None:
            if not self.plan.unchecked_reads:  # (once they are, the first step has found every read's bytes: _learn)
                self._need(group, reader)
            value = self.values.get(dep.name, MISSING)
            if value is MISSING:  # (an unmanaged node's value goes at its free: the schedule freed it)
                raise ExecutionError(f"{reader} reads {self.ex.graph.nodes[group].name}, which the schedule does not hold in RAM (freed); replay the schedule with poetlab.simulate")
            return detached_aliases(value) if detach else value
        if dep.name not in self.constants:  # get_attr, or a node computing no tensor (a size, ...)
            self.constants[dep.name] = self._run_fx(dep, lambda d: self._resolve(d, local, detach, reader))
        return self.constants[dep.name]

    def _run_fx(self, n: fx.Node, lookup: Callable[[fx.Node], object]) -> object:
        args = fx.node.map_arg(n.args, lookup)
        kwargs = fx.node.map_arg(n.kwargs, lookup)
        if n.op == "call_module":
            return self.layout.modules[n.target](*args, **kwargs)
        if n.op == "call_function":
            return n.target(*args, **kwargs)
        if n.op == "call_method":
            obj, *rest = args
            return getattr(obj, n.target)(*rest, **kwargs)
        if n.op == "get_attr":
            return fetch_attr(self.layout.gm, str(n.target))
        if n.op == "placeholder":
            return self.inputs[self.layout.placeholders.index(n)]
        raise ExecutionError(f"cannot run fx node {n.name} ({n.op})")

    def _run_group(self, i: int, rerun: bool) -> tuple[dict[str, object], object]:
        """Run forward node ``i``'s fx nodes; returns (values of its external fx nodes, its output). A rerun
        reads its inputs detached and runs the reruns' code (``StepLayout.rerun_code``)."""
        binding = self.layout.binding
        reader = self.ex.graph.nodes[i].name
        if i == binding.loss:
            output = binding.output_arg
            if isinstance(output, fx.Node):  # (the usual single output: without map_arg's Python work)
                model_out = self._resolve(output, {}, rerun, reader)
            else:
                model_out = fx.node.map_arg(output, lambda d: self._resolve(d, {}, rerun, reader))
            return {}, self.ex.loss_fn(model_out, self.targets)
        compiled = (self.layout.rerun_code if rerun else self.layout.compiled)[i]
        if compiled is not None:
            results = compiled.run(*[self._resolve(d, {}, rerun, reader) for d in compiled.deps])
            return dict(zip(self.layout.external[i], results, strict=True)), results[-1]
        local: dict[str, object] = {}
        out: object = None
        for m in binding.members[i]:
            out = local[m.name] = self._run_fx(m, lambda d: self._resolve(d, local, rerun, reader))
        return {name: local[name] for name in self.layout.external[i]}, out

    def _first_compute(self, i: int) -> None:
        if i in self.layout.binding.inputs:
            self._take_batch(i)
            return
        self.begin(i, i in self.plan.packed)
        if i in self.layout.graphless:  # (begin and finish keep its random state, as any node's)
            values, out = self._run_graphless(i)
        elif torch.is_grad_enabled():  # (the forward pass: go; if it fails, close() switches the hooks off)
            values, out = self._run_group(i, rerun=False)
        else:
            with torch.enable_grad():
                values, out = self._run_group(i, rerun=False)
        self.values.update(values)
        if i == self.layout.binding.loss:
            self.loss = out
            self.loss_value = out.item()
        self.finish(i, values, out if i == self.layout.binding.loss else list(values.values()))

    def _run_graphless(self, i: int) -> tuple[dict[str, object], object]:
        """:meth:`_run_group` of a graphless node's first run (:class:`GraphlessRun`)."""
        compiled, reader = self.layout.compiled[i], self.ex.graph.nodes[i].name
        assert compiled is not None
        results = GraphlessRun.apply(self.state[i], compiled.run, self.ex.trigger, *[self._resolve(d, {}, False, reader) for d in compiled.deps])
        return dict(zip(self.layout.external[i], results, strict=True)), results[-1]

    def graphless_in_segment(self, i: int, *deps: object) -> tuple[object, ...]:
        """A graphless node's first run in a segment's code (:class:`GraphlessRun`), its random state kept
        where it draws random numbers (learnt on the first step, as :meth:`finish` does), for its rerun;
        the rest of its compute is an unmanaged node's."""
        st = self.state[i]
        draws = self.ex.draws_rng.get(i)
        before = torch.get_rng_state() if draws is not False else None
        results = GraphlessRun.apply(st, self.layout.compiled[i].run, self.ex.trigger, *deps)  # type: ignore[union-attr]
        # (held until its free: the segment's code drops them at their last use, and a storage gone before
        # then would leave its key, made known while the first step tracks storages, to the next one made there)
        st.first_values = results
        if draws is None:
            draws = self.ex.draws_rng[i] = not torch.equal(before, torch.get_rng_state())  # type: ignore[arg-type]
        st.rng_state = before if draws else None
        return results

    def compute_loss(self, i: int, model_out: object) -> None:
        """The loss node ``i``'s first compute in a segment, on the model's outputs: what
        :meth:`_first_compute` does for an unpacked loss, in one call."""
        self.loss = loss = self.ex.loss_fn(model_out, self.targets)
        self.loss_value = loss.item()
        self.n_computes += 1
        self.state[i].computed = True
        self._set_in_ram(i, True)
        if self.layout.binding.backward_of_forward.get(i) in self.plan.hook_at:
            self.hook_backward(i, loss, defer=True)

    def _take_batch(self, i: int) -> None:
        """Input node ``i`` (placeholders only): the caller's batch, never freed or paged, whose storages
        count as constants. Taken as it is, without the general path."""
        values = {name: self.inputs[k] for name, k in self.layout.batch_of[i]}
        self.values.update(values)
        if self.plan.tracking:  # (else no storage is looked up by key: _learn)
            storages = storages_of(values.values())
            self.batch_keys.update(storage_key(storage) for storage in storages)
            if self._constant_keys is not None:
                self._constant_keys |= self.batch_keys
            self.track_values(i, storages)
        self.state[i].computed = True
        self._set_in_ram(i, True)

    def _recompute(self, i: int) -> None:
        """Rerun forward node ``i`` on its inputs and put the fresh bytes into its emptied storages."""
        st = self.state[i]
        if i in self.layout.binding.inputs:  # the caller's batch never left: nothing to rerun
            self._set_in_ram(i, True)
            return
        # the buffers it updates a second time (_node_buffers: not BatchNorm's, whose stand-ins write none)
        # are put back after it; in the backward pass, once after it (ScheduleExecutor.rerun_buffers)
        kept = self.buffers_kept and i in self.layout.rerun_in_backward
        buffers, backup = ([], []) if kept else self.ex.group_buffers(i)
        if buffers:
            torch._foreach_copy_(backup, buffers)
        # the buffers it writes, whose versions go back after it where it leaves them as they were saved: put
        # back here, or reset before the backward pass (ScheduleExecutor._without_hooks); not those kept
        # and put back after the backward pass
        touched = None
        if self.plan.hookless and not kept:
            touched = buffers
        elif self.plan.hookless and self.ex.rerun_buffers().before_step is not None:
            touched = self.ex.group_buffers(i)[0]
        versions = [b._version for b in touched] if touched else None
        # The pack hook is ``recorded.append``: only the tensor is wanted (its storage is what the rerun made),
        # and the rerun's graph is never run backward, so autograd keeps nothing (append's None). Handing
        # ``t`` back would leak: a node that saves its own output (ReLU, BatchNorm's statistics) would hold it
        # while it holds the node, a cycle through C++ that Python's collector cannot break, pinning the
        # rerun's inputs' memory on every step. (A C method, not a Python function: no frame per tensor.)
        recorded: list[torch.Tensor] = []
        rng_after = None
        if st.rng_state is not None:  # (what torch.random.fork_rng does on the CPU, without its overhead)
            rng_after = torch.get_rng_state()
            torch.set_rng_state(st.rng_state)
        graphless = i in self.layout.graphless
        start = time.thread_time()
        grad_was = torch.is_grad_enabled()  # (off in the backward pass)
        if not graphless:
            push_saved_hooks(recorded.append, never_unpacked)
        try:
            torch._C._set_grad_enabled(True)  # (torch.enable_grad's own call, without its two Python calls)
            if graphless:  # (its graph is kept: autograd runs it backward, GraphlessRun.backward)
                compiled, reader = self.layout.rerun_code[i], self.ex.graph.nodes[i].name
                inputs = [self._resolve(d, {}, True, reader) for d in compiled.deps]  # type: ignore[union-attr]
                results = compiled.run(*inputs)  # type: ignore[union-attr]
            else:
                values, _ = self._run_group(i, rerun=True)
        finally:
            torch._C._set_grad_enabled(grad_was)
            if not graphless:
                pop_saved_hooks()
            self.recompute_cpu_s += time.thread_time() - start
            if rng_after is not None:
                torch.set_rng_state(rng_after)
        if buffers:
            copy_buffers(buffers, backup)
        if versions is not None:
            set_versions(touched, versions)
        if graphless:
            # (the detached inputs are the step's values; the constants, its parameters, are not: their
            # gradients go to them directly)
            st.rerun = (results, inputs, [d.name in self.layout.group_of for d in compiled.deps])  # type: ignore[union-attr]
            self._set_in_ram(i, True)
            return
        try:
            if len(recorded) != st.n_packs:
                raise ExecutionError(f"recomputing {self.ex.graph.nodes[i].name} saved {len(recorded)} tensors where its first run saved {st.n_packs}; the node is not deterministic")
            for record in st.owned:  # (_wait and materialized inlined: the encoder's layer owns 21 storages)
                if record.pending is not None:
                    self._wait(record)
                storage, nbytes, where = record.storage, record.nbytes, record.source
                if storage.nbytes() == nbytes:
                    continue  # still held by a view that stayed in RAM
                source = (recorded[where[1]] if where[0] == "pack" else tensors_in(values[where[1]])[where[2]]).untyped_storage()
                if source.nbytes() != nbytes:
                    raise ExecutionError(f"recomputing {self.ex.graph.nodes[i].name} gave {source.nbytes()} bytes where its first run gave {nbytes}")
                storage._swap_data_ptr_(source)  # the fresh bytes move in: no copy, no second buffer
        finally:
            recorded.clear()  # (autograd's nodes of the rerun hold its append, and with it this list)
            del values
        self._set_in_ram(i, True)
