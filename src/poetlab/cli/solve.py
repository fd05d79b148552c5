"""``poetlab solve``: the minimum-energy schedule within the budgets (the POET MILP)."""

from __future__ import annotations

import argparse
import json

from poetlab.core.costs import CostModel
from poetlab.errors import InvalidArgumentError
from poetlab.core.graph import TrainingGraph
from poetlab.core.platforms import HOST, load_platform
from poetlab.planners.poet.solver import solve

from poetlab.cli.common import EXIT_NO_SCHEDULE, graph_and_costs, host_costs, host_profile


def _technique_graph_and_costs(args: argparse.Namespace, graph: TrainingGraph, costs: CostModel) -> tuple[TrainingGraph, CostModel]:
    """Apply ``--freeze-before`` (sparse update as a graph transformation) and ``--compress`` (compression
    costs from densities: measured on the model's torch counterpart, or ``--density`` for all)."""
    if args.freeze_before is None and not args.compress:
        return graph, costs
    from poetlab.techniques import compression as comp
    from poetlab.techniques.transforms import sparse_update_graph

    if args.freeze_before is not None:
        graph = sparse_update_graph(graph, args.freeze_before)
        costs = CostModel.from_flops(graph, load_platform(args.platform, args.platform_dir))
    if args.compress:
        traced = graph.metadata.get("source") == "poetlab.torch.trace"
        if args.density is not None:
            kinds = comp.TRACED_SPARSE_KINDS if traced else comp.SPARSE_KINDS
            densities = {i: args.density for i, node in enumerate(graph.nodes) if node.kind.split("+")[-1] in kinds and not node.is_backward}
        elif traced:  # measured node by node on the module and batch it was traced from
            from poetlab.torch.models import build_torch_model

            built = build_torch_model(args.model, args.batch_size, int(graph.metadata.get("seed", 0)))
            densities = comp.graph_densities(built.module, built.inputs, built.loss_fn, built.targets, graph)
        else:
            from poetlab.torch.models import TORCH_MODELS, build_torch_model

            twin = f"{args.model}_torch"
            if twin not in TORCH_MODELS:
                raise InvalidArgumentError(f"no torch model {twin!r} to measure densities on; give --density D (0 < D < 1)")
            built = build_torch_model(twin, args.batch_size, 0)
            densities = comp.densities_for_graph(graph, comp.measure_densities(built.module, built.inputs))
        if args.platform == HOST:  # compress and decompress timed here, at the profile's compute power
            import torch

            from poetlab.torch.host_profile import HostProfile, find_host_profile

            profile = HostProfile.load(args.profile or find_host_profile(args.model, args.fuse))
            threads = torch.get_num_threads()
            torch.set_num_threads(profile.machine.torch_threads)
            try:
                rates = comp.measure_bitmap_rates(clock=profile.clock)
            finally:
                torch.set_num_threads(threads)
            compression = comp.compression_costs(graph, profile.platform(), densities, margin=args.density_margin, rates=rates)
        else:
            compression = comp.compression_costs(graph, load_platform(args.platform, args.platform_dir), densities, margin=args.density_margin)
        costs = costs.with_compression(compression)
    return graph, costs


def _scheme_graph_and_costs(args: argparse.Namespace) -> tuple[TrainingGraph, CostModel]:
    """``--sparse-update SCHEME``: the traced graph of the torch model with the scheme applied for real
    (:func:`poetlab.techniques.transforms.scheme_graph`), costed like any traced graph."""
    from poetlab.techniques.sparse_update import parse_scheme
    from poetlab.techniques.transforms import scheme_graph
    from poetlab.torch.models import TORCH_MODELS, build_torch_model

    if args.model not in TORCH_MODELS:
        hint = f" (try {args.model}_torch, or --freeze-before N on the paper graph)" if f"{args.model}_torch" in TORCH_MODELS else ""
        raise InvalidArgumentError(f"--sparse-update applies to traced torch models; {args.model!r} is not one{hint}; valid: {', '.join(TORCH_MODELS)}")
    if args.freeze_before is not None:
        raise InvalidArgumentError("give --sparse-update or --freeze-before, not both (--freeze-before is for paper models)")
    platform = None if args.platform == HOST else load_platform(args.platform, args.platform_dir)
    profile = host_profile(args) if platform is None else None
    built = build_torch_model(args.model, args.batch_size)
    scheme = parse_scheme(args.sparse_update, built.module)
    graph = scheme_graph(built.module, scheme, built.inputs, built.loss_fn, built.targets, fuse=args.fuse, name=args.model).graph
    return graph, (host_costs(graph, args, profile) if platform is None else CostModel.from_flops(graph, platform))


def cmd_solve(args: argparse.Namespace) -> int:
    graph, costs = _scheme_graph_and_costs(args) if args.sparse_update is not None else graph_and_costs(args)
    graph, costs = _technique_graph_and_costs(args, graph, costs)
    result = solve(
        graph,
        costs,
        args.ram_budget,
        args.runtime_budget,
        paging=not args.no_paging,
        remat=not args.no_remat,
        count_paging_time=args.count_paging_time,
        charge_pagein=args.charge_pagein,
        params_in_budget=args.params_in_budget,
        compression=args.compress,
        solver=args.solver,
        time_limit_s=args.time_limit,
        mip_gap=args.mip_gap,
        threads=args.threads,
        verbose=args.verbose,
    )
    if args.plot and result.schedule is not None:
        from poetlab.reproduction.plotting import save_figure, schedule_figure

        title = f"{args.model} on {args.platform}: {result.status}, {result.energy_j:.6g} J"
        save_figure(schedule_figure(result.schedule, result.simulation, args.ram_budget, title), args.plot)
    if args.json:
        extra = {"sparse_update": graph.metadata["sparse_update_scheme"], "trained_param_bytes": graph.param_bytes} if args.sparse_update is not None else {}
        print(json.dumps({"model": args.model, "platform": costs.platform, **extra, **result.to_dict()}, indent=2))
    elif result.schedule is None:
        print(f"{result.status}: {result.message}")
    else:
        print(
            f"POET {result.status} ({result.solver}, {result.solve_time_s:.2f} s): {result.energy_j:.10g} J "
            f"= {result.compute_energy_j:.10g} J compute + {result.pagein_energy_j + result.pageout_energy_j:.6g} J paging; "
            f"peak {result.peak_ram_bytes:,} of {int(args.ram_budget):,} bytes; runtime {result.runtime_s:.6g} s; "
            f"{result.n_recomputes} recomputes, {result.n_pageouts} page-outs"
            + (f", {result.n_compresses} compressions ({result.compression_energy_j:.6g} J)" if args.compress else "")
            + f"; gap {result.mip_gap:.2e}"
        )
        if result.status != "optimal":
            print(result.message)
    return 0 if result.schedule is not None else EXIT_NO_SCHEDULE
