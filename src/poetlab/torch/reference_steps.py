"""Reference steps the executor is measured and checked against (``benchmarks/bench_execute.py``,
``benchmarks/ab_execute.py``, ``tests/torch/test_reference_steps.py``): :class:`HandStep`, a plain step doing a
schedule's reruns and paging by hand, and :class:`CheckpointStep`, the same reruns by
``torch.utils.checkpoint``. See docs/benchmarks.md."""

from __future__ import annotations

import operator
import time

import torch
from torch import fx
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from poetlab.core.schedule import OpKind, Schedule
from poetlab.torch.execute.codegen import bind_graph, generated_module, group_function
from poetlab.torch.paging import PageStore
from poetlab.torch.fx_trace import traced_module


class HandStep:
    """A plain step that does a schedule's reruns and its paging by hand, without the executor: the
    reference that separates the executor's own time from what recomputing and paging cost a step by
    themselves.

    A rerun on a CPU may cost more than its operations: it writes fresh tensors in the middle of the
    backward pass and evicts from the caches what the next backward operations would have found there
    (``bench_cache_disruption.py`` bounds it from above). So may a page-out or a page-in: the kernel copies
    the bytes through the caches and the page cache. The executor's ``recompute_cpu_s`` and
    ``paging_cpu_s`` time only the calls themselves, so ``machinery_overhead_vs_plain`` counts such effects
    as the executor's; the time beyond this step does not.

    Here the model runs as its fx trace's generated code (a plain step's speed), which also returns the
    inputs of every node the schedule recomputes; each rerun runs that node's fx nodes as the executor's rerun
    code does (its BatchNorm modules through their stand-ins, which update no running statistics) with grad
    enabled and its saved tensors collected, and its result is dropped. A node that draws
    random numbers (``rng_nodes``: dropout; the executor's ``draws_rng`` after its first step) reruns on the
    random state it ran on, taken before it in the forward pass and the state after the rerun put back, as
    ``torch.utils.checkpoint`` keeps it: a rerun that draws other numbers is not the schedule's. Each page-out
    writes as many bytes as the node's (the schedule's size of it, what the executor writes) from a buffer
    kept for it, through a :class:`PageStore` as the executor's (one file, ``fsync``, the page cache
    dropped), and each page-in reads them back into that buffer. Both run, in the schedule's order, from a
    pre-hook on the autograd node of the backward node the schedule computes next; those the schedule
    places in the forward pass (or before a node whose output has no autograd node) run after the forward
    pass, before the backward pass. No storage is freed, swapped or checked, and the store's directory
    lives as long as this step (the executor makes one per step: its own time): what this costs beyond a
    plain step is the reruns, the paging and their effect on the rest of the step."""

    def __init__(self, module: torch.nn.Module, graph, schedule, loss_fn, paging_dir: str | None = None, rng_nodes=frozenset()):
        self.module, self.loss_fn = module, loss_fn
        gm = traced_module(module, graph.metadata)
        binding = bind_graph(graph, gm)
        pending: list[tuple[OpKind, int]] = []  # (a recompute, a page-out or a page-in; in the schedule's order)
        attach: dict[int, list[tuple[OpKind, int]]] = {}  # forward node whose output's autograd node runs them -> them
        computed: set[int] = set()
        for op in schedule.ops:
            i, forward = op.node, binding.forward_of[op.node]
            if op.kind in (OpKind.PAGE_OUT, OpKind.PAGE_IN):
                if forward is None and i not in binding.inputs:  # (the executor pages no gradient, nor the batch)
                    pending.append((op.kind, i))
                continue
            if op.kind is not OpKind.COMPUTE:
                continue
            if forward is None and i in computed and i not in binding.inputs and i != binding.loss:
                pending.append((OpKind.COMPUTE, i))
            elif forward is not None and pending:
                attach.setdefault(forward, []).extend(pending)
                pending = []
            computed.add(i)
        early = attach.pop(binding.loss, []) + pending
        actions = [a for acts in attach.values() for a in acts] + early
        reruns = {i for kind, i in actions if kind is OpKind.COMPUTE}
        self.functions = {i: group_function(gm, binding.members[i], (binding.members[i][-1].name,), rerun=True) for i in reruns}
        needed = list(dict.fromkeys([d for i in reruns for d in self.functions[i].deps] + [binding.members[f][-1] for f in attach]))
        copied = fx.Graph()
        mapping: dict[fx.Node, fx.Node] = {}
        out = copied.graph_copy(gm.graph, mapping)
        self.rng_nodes = sorted(reruns & set(rng_nodes))
        states = []
        for i in self.rng_nodes:
            with copied.inserting_before(mapping[binding.members[i][0]]):
                states.append(copied.call_function(torch.get_rng_state))
        copied.output((out, tuple(mapping[n] for n in needed), tuple(states)))
        self.gm = generated_module(gm, copied)  # (each module one attribute away, as the executor's code reaches it)
        self.names = [n.name for n in needed]
        self.deps = {i: [d.name for d in self.functions[i].deps] for i in reruns}
        self.attach = [(binding.members[f][-1].name, acts) for f, acts in attach.items()]
        self.hook_only = {name for name, _ in self.attach} - {name for names in self.deps.values() for name in names}
        # each input goes after the last rerun that reads it (as the schedule frees it after its last use)
        self.readers: dict[str, int] = {}
        for i in (i for kind, i in actions if kind is OpKind.COMPUTE):
            for name in self.deps[i]:
                self.readers[name] = self.readers.get(name, 0) + 1
        self.early = early
        self.n_reruns = sum(kind is OpKind.COMPUTE for kind, _ in actions)
        self.n_pageouts = sum(kind is OpKind.PAGE_OUT for kind, _ in actions)
        paged = sorted({i for kind, i in actions if kind is not OpKind.COMPUTE})
        # (zeros, not empty: their memory touched before the first step, as a node's output is when it pages out)
        self.pages = {i: torch.zeros(graph.nodes[i].output_bytes, dtype=torch.uint8).untyped_storage() for i in paged}
        self.store = PageStore(paging_dir) if paged else None
        self.rerun_cpu_s, self.left, self.rng_states = 0.0, dict(self.readers), {}

    def close(self) -> None:
        """Remove the paging directory and its files."""
        if self.store is not None:
            self.store.close()

    def _run(self, actions: list[tuple[OpKind, int]], values: dict[str, object]) -> None:
        for kind, i in actions:
            if kind is OpKind.PAGE_OUT:
                self.store.write(str(i), [self.pages[i]])
                continue
            if kind is OpKind.PAGE_IN:
                self.store.read_into(str(i), [(0, self.pages[i])])
                continue
            state = self.rng_states.get(i)
            if state is not None:
                after = torch.get_rng_state()
                torch.set_rng_state(state)
            start = time.thread_time()
            saved: list[torch.Tensor] = []  # (kept here, not handed back to autograd: see the executor's rerun)
            with torch.autograd.graph.saved_tensors_hooks(saved.append, lambda _: None), torch.enable_grad():
                self.functions[i].run(*[v.detach() if isinstance(v, torch.Tensor) else v for v in (values[name] for name in self.deps[i])])
            saved.clear()  # (the rerun's autograd nodes hold the hook, and with it this list: no cycle left)
            self.rerun_cpu_s += time.thread_time() - start
            if state is not None:  # (outside the rerun's time, as the executor's recompute_cpu_s has it)
                torch.set_rng_state(after)
            for name in self.deps[i]:
                self.left[name] -= 1
                if not self.left[name]:
                    del values[name]

    def step(self, inputs, targets) -> tuple[float, float, float]:
        """(thread CPU time of the step, of its reruns, of its paging calls)."""
        self.rerun_cpu_s, self.left = 0.0, dict(self.readers)
        paging_before = self.store.cpu_s if self.store is not None else 0.0
        start = time.thread_time()
        out, extra, states = self.gm(*inputs) if isinstance(inputs, (tuple, list)) else self.gm(inputs)
        values = dict(zip(self.names, extra, strict=True))
        self.rng_states = dict(zip(self.rng_nodes, states, strict=True))
        del extra, states
        loss = self.loss_fn(out, targets)
        del out
        fns = [(getattr(values[name], "grad_fn", None), actions) for name, actions in self.attach]
        for name in self.hook_only:  # (the reruns' inputs stay, as the executor keeps them; the rest goes)
            del values[name]
        now = list(self.early)
        for fn, actions in fns:
            if fn is None:  # (an output without an autograd node: nothing to hook, done before the backward)
                now += actions
            else:
                fn.register_prehook(lambda *_, actions=actions: self._run(actions, values))
        self._run(now, values)
        try:
            loss.backward()
        finally:
            values.clear()  # (the pre-hooks hold it, and it holds tensors whose autograd nodes hold them)
            del loss  # (what is left of the graph goes here, inside the time, as in a plain step and the executor's)
        paging_cpu_s = self.store.cpu_s - paging_before if self.store is not None else 0.0
        return time.thread_time() - start, self.rerun_cpu_s, paging_cpu_s


class _Checkpointed(torch.nn.Module):
    """A run of the model's nodes under ``torch.utils.checkpoint.checkpoint`` (the random state preserved:
    dropout's masks are drawn again alike), as one module call of :class:`CheckpointStep`'s code. ``run`` is
    generated code on the model's own modules (``poetlab.torch.execute.group_function``).

    Non-reentrant (the default, what PyTorch recommends): the forward pass builds the run's autograd graph
    with saved-tensor hooks that keep nothing, and the rerun runs the whole run of nodes, as the schedule's
    does (checkpoint's early stop, on by default, would end it after the last tensor it saves, skipping what
    comes after: a layer's last operations). Reentrant: the forward pass runs the nodes with grad off (no
    autograd graph, nothing saved, no hook) inside one autograd function, whose backward reruns them with
    grad on and runs autograd's engine once more on that graph. It needs an input that requires grad to
    be called backward at all (a run that reads only the batch would get no gradient), so one more input,
    a 0-d tensor that requires grad and is not read, is passed to it."""

    def __init__(self, run, reentrant: bool = False):
        super().__init__()
        self.run, self.reentrant = run, reentrant
        self.trigger = torch.zeros((), requires_grad=True)  # (a plain attribute: not the model's parameter)

    def _run_reading_all_but_the_last(self, *args):
        return self.run(*args[:-1])

    def forward(self, *args):
        if self.reentrant:
            return checkpoint(self._run_reading_all_but_the_last, *args, self.trigger, use_reentrant=True, preserve_rng_state=True)
        with set_checkpoint_early_stop(False):
            return checkpoint(self.run, *args, use_reentrant=False, preserve_rng_state=True)


class CheckpointStep:
    """A plain step in which PyTorch's own tool does the schedule's reruns: the model's fx code with each run
    of consecutive forward nodes that the schedule recomputes wrapped in ``torch.utils.checkpoint``
    (:class:`_Checkpointed`). Checkpoint keeps a run's inputs and frees what it saved, and in the backward
    pass reruns it, with grad on and its saved tensors collected by saved-tensor hooks, when autograd first
    reads one of them: the work a schedule that reruns each of those nodes once in the backward pass asks
    for. Its time beyond a plain step is its reruns and PyTorch's own machinery for them, what a user who
    checkpoints by hand pays; the executed step's time beside it compares the two machineries on the same
    reruns. Only for such schedules (:meth:`for_schedule`): nothing paged, each node rerun at most once.
    BatchNorm's running statistics are updated again by checkpoint's reruns (torch.utils.checkpoint does
    not put them back; the executor does), which changes no gradient in training mode. ``reentrant``
    picks checkpoint's older implementation (:class:`_Checkpointed`), whose forward pass builds no graph
    for the runs at all; its gradients are checked as the other's, since its second run of the engine
    accumulates the runs' parameters' gradients on its own (a parameter also read outside a run could
    come out in another order of additions)."""

    def __init__(self, gm: fx.GraphModule, runs: list[list[int]], loss_fn):
        self.gm, self.runs, self.loss_fn = gm, runs, loss_fn  # (runs: the graph's nodes under each checkpoint)

    @classmethod
    def for_schedule(cls, module: torch.nn.Module, graph, schedule: Schedule, loss_fn, reentrant: bool = False) -> "CheckpointStep | None":
        """The checkpoint step doing ``schedule``'s reruns, or None where checkpoint cannot (paging, a node
        rerun twice, no rerun, or a run of nodes whose fx code another node's interleaves)."""
        if any(op.kind not in (OpKind.COMPUTE, OpKind.FREE) for op in schedule.ops):
            return None
        gm = traced_module(module, graph.metadata)
        binding = bind_graph(graph, gm)
        reruns = [i for i in schedule.recomputed_nodes() if i not in binding.inputs]
        if not reruns or len(set(reruns)) != len(reruns) or any(binding.forward_of[i] is not None for i in reruns):
            return None
        runs: list[list[int]] = []
        for i in sorted(reruns):
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        copied = fx.Graph()
        mapping: dict[fx.Node, fx.Node] = {}
        copied.output(copied.graph_copy(gm.graph, mapping))
        for k, run in enumerate(runs):
            members = [m for i in run for m in binding.members[i]]
            inside = set(members)
            external = [m for m in members if any(user not in inside for user in m.users)]
            compiled = group_function(gm, members, [m.name for m in external])
            name = f"poetlab_checkpoint_{k}"
            gm.add_submodule(name, _Checkpointed(compiled.run, reentrant))
            copies = [mapping[m] for m in members]
            with copied.inserting_after(copies[-1]):
                call = copied.call_module(name, tuple(mapping[d] for d in compiled.deps))
            with copied.inserting_after(call):
                for index, m in reversed(list(enumerate(external))):
                    value = copied.call_function(operator.getitem, (call, index))
                    mapping[m].replace_all_uses_with(value)
                    mapping[m] = value  # (a later run may read it)
            for c in reversed(copies):
                copied.erase_node(c)
        try:
            copied.lint()
        except RuntimeError:  # (a node outside a run reads a value of the run before the run ends)
            return None
        return cls(generated_module(gm, copied), runs, loss_fn)

    def step(self, inputs, targets) -> float:
        """Thread CPU time of the step, its autograd graph let go inside it (as in a plain step)."""
        start = time.thread_time()
        out = self.gm(*inputs) if isinstance(inputs, (tuple, list)) else self.gm(inputs)
        loss = self.loss_fn(out, targets)
        del out
        loss.backward()
        del loss
        return time.thread_time() - start
