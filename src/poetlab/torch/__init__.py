"""Everything that imports torch: the models (:mod:`~poetlab.torch.models`), tracing an ``nn.Module`` into a
:class:`~poetlab.core.graph.TrainingGraph` (:mod:`~poetlab.torch.trace`, one node run alone:
:mod:`~poetlab.torch.probes`), allocator measurements (:mod:`~poetlab.torch.allocations`), paging to real files
(:mod:`~poetlab.torch.paging`), host profiling (:mod:`~poetlab.torch.profile`; the profile as data:
:mod:`~poetlab.torch.host_profile`), running a schedule with real autograd (:mod:`~poetlab.torch.execute`) and
fine-tuning under a schedule (:mod:`~poetlab.torch.finetune`). ``import poetlab`` does not import this package.
"""
