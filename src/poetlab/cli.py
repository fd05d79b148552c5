"""The ``poetlab`` command: a thin shell over the package's functions.

Errors a person can fix (a :class:`~poetlab.errors.PoetlabError`) are printed as one line on stderr
and exit with code 2, as argparse does for bad flags.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict

from poetlab import __version__
from poetlab._io import write_text_atomic
from poetlab.costs import CostModel
from poetlab.errors import InvalidArgumentError, PoetlabError, UnknownNameError
from poetlab.graph import TrainingGraph
from poetlab.paper_models import PAPER_MODELS, build_paper_graph
from poetlab.platforms import HOST, available_platforms, load_platform
from poetlab.poet_solver import solve
from poetlab.summary import summarize_graph

EXIT_USAGE = 2
EXIT_NO_SCHEDULE = 1  # `solve` found no schedule (infeasible, or nothing within the time limit)
log = logging.getLogger("poetlab")


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage is one ``--help`` away)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value




def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="paper model or torch model name (see `poetlab models`)")
    parser.add_argument("--platform", required=True, help="platform name (see `poetlab platforms`), `host`, or a platform YAML file")
    parser.add_argument("--platform-dir", default=None, help="directory of platform YAML files (default: the checkout's data/platforms)")
    parser.add_argument("--batch-size", type=_positive_int, default=1, help="batch size (default 1)")
    parser.add_argument("--fuse", action="store_true", help="torch models: fuse cheap element-wise nodes into their producers")
    parser.add_argument("--profile", default=None, metavar="FILE", help="host profile JSON (default: data/profiles/host-MODEL.json, else any host profile there)")


def _model_graph(model: str, batch_size: int, fuse: bool) -> TrainingGraph:
    """A paper model's layer-list graph, or a torch model's traced graph (torch imported only then)."""
    if model in PAPER_MODELS:
        if fuse:
            raise InvalidArgumentError(f"--fuse applies to traced torch models; {model} is a paper model (try {model}_torch)")
        return build_paper_graph(model, batch_size)
    from poetlab.torch_models import TORCH_MODELS

    if model in TORCH_MODELS:
        from poetlab.trace import trace_torch_model

        return trace_torch_model(model, batch_size, fuse=fuse)
    raise UnknownNameError("model", model, [*PAPER_MODELS, *TORCH_MODELS])


def _host_costs(graph: TrainingGraph, args: argparse.Namespace) -> CostModel:
    """Measured per-node costs when the profile timed this graph; else flops at the host's measured rate."""
    from poetlab.profile import HostProfile, find_host_profile

    path = args.profile or find_host_profile(args.model, args.fuse)
    profile = HostProfile.load(path)
    timed = profile.model
    if timed is not None and tuple(n.name for n in timed.nodes) == tuple(n.name for n in graph.nodes):
        log.info("host costs: per-node times measured in %s", path)
        return CostModel.from_profile(graph, profile)
    log.warning("%s has no per-node timings for this graph; costing it by flops at the host's measured %.3g flop/s", path, profile.flops_per_s)
    return CostModel.from_flops(graph, profile.platform())


def _graph_and_costs(args: argparse.Namespace) -> tuple[TrainingGraph, CostModel]:
    platform = None if args.platform == HOST else load_platform(args.platform, args.platform_dir)
    graph = _model_graph(args.model, args.batch_size, args.fuse)
    if platform is None:
        return graph, _host_costs(graph, args)
    return graph, CostModel.from_flops(graph, platform)


def _cmd_graph(args: argparse.Namespace) -> int:
    graph, costs = _graph_and_costs(args)
    summary = summarize_graph(graph, costs)
    if args.output:
        write_text_atomic(args.output, graph.to_json())
        log.info("wrote the training graph to %s", args.output)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
        return 0
    rows = [
        ("model", f"{summary.model} (batch {summary.batch_size})"),
        ("platform", summary.platform),
        ("nodes", f"{summary.n_nodes} ({summary.n_forward} forward, {summary.n_backward} backward)"),
        ("edges", f"{summary.n_edges} ({summary.n_unique_edges} distinct)"),
        ("total runtime", f"{summary.total_runtime_s:.9g} s"),
        ("forward RAM", f"{summary.forward_ram_bytes:,} bytes"),
        ("largest tensor", f"{summary.peak_tensor_bytes:,} bytes"),
        ("plain-step energy", f"{summary.plain_step_energy_j:.12g} J"),
        ("parameters", f"{summary.param_bytes:,} bytes"),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    return 0


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
        traced = graph.metadata.get("source") == "poetlab.trace"
        if args.density is not None:
            kinds = comp.TRACED_SPARSE_KINDS if traced else comp.SPARSE_KINDS
            densities = {i: args.density for i, node in enumerate(graph.nodes) if node.kind.split("+")[-1] in kinds and not node.is_backward}
        elif traced:  # measured node by node on the module and batch it was traced from
            from poetlab.torch_models import build_torch_model

            built = build_torch_model(args.model, args.batch_size, int(graph.metadata.get("seed", 0)))
            densities = comp.graph_densities(built.module, built.inputs, built.loss_fn, built.targets, graph)
        else:
            from poetlab.torch_models import TORCH_MODELS, build_torch_model

            twin = f"{args.model}_torch"
            if twin not in TORCH_MODELS:
                raise InvalidArgumentError(f"no torch model {twin!r} to measure densities on; give --density D (0 < D < 1)")
            built = build_torch_model(twin, args.batch_size, 0)
            densities = comp.densities_for_graph(graph, comp.measure_densities(built.module, built.inputs))
        if args.platform == HOST:  # compress and decompress timed here, at the profile's compute power
            import torch

            from poetlab.profile import HostProfile, find_host_profile

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
    from poetlab.torch_models import TORCH_MODELS, build_torch_model

    if args.model not in TORCH_MODELS:
        hint = f" (try {args.model}_torch, or --freeze-before N on the paper graph)" if f"{args.model}_torch" in TORCH_MODELS else ""
        raise InvalidArgumentError(f"--sparse-update applies to traced torch models; {args.model!r} is not one{hint}; valid: {', '.join(TORCH_MODELS)}")
    if args.freeze_before is not None:
        raise InvalidArgumentError("give --sparse-update or --freeze-before, not both (--freeze-before is for paper models)")
    platform = None if args.platform == HOST else load_platform(args.platform, args.platform_dir)
    built = build_torch_model(args.model, args.batch_size)
    scheme = parse_scheme(args.sparse_update, built.module)
    graph = scheme_graph(built.module, scheme, built.inputs, built.loss_fn, built.targets, fuse=args.fuse, name=args.model).graph
    return graph, (_host_costs(graph, args) if platform is None else CostModel.from_flops(graph, platform))


def _cmd_solve(args: argparse.Namespace) -> int:
    graph, costs = _scheme_graph_and_costs(args) if args.sparse_update is not None else _graph_and_costs(args)
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
        from poetlab.plotting import save_figure, schedule_figure

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


def _cmd_execute(args: argparse.Namespace) -> int:
    import statistics

    import torch

    from poetlab.execute import retain_freed_memory
    from poetlab.finetune import compare_training
    from poetlab.torch_models import TORCH_MODELS, build_torch_model

    if args.model not in TORCH_MODELS:
        raise InvalidArgumentError(f"only traced torch models can be executed, not {args.model!r}; valid: {', '.join(TORCH_MODELS)}")
    graph, costs = _graph_and_costs(args)
    result = solve(graph, costs, args.ram_budget, time_limit_s=args.time_limit)
    if result.schedule is None:
        print(f"{result.status}: {result.message}")
        return EXIT_NO_SCHEDULE
    model = build_torch_model(args.model, args.batch_size)
    retain_freed_memory()  # (this process runs schedules: no page faults for memory freed mid-step)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        comparison = compare_training(
            model.module, graph, result.schedule, model.loss_fn, [(model.inputs, model.targets)] * args.steps,
            lambda params: torch.optim.SGD(params, lr=args.lr), progress=sys.stderr.isatty(),
            prefetch=args.prefetch, paging_dir=args.paging_dir,
        )
    finally:
        torch.use_deterministic_algorithms(previous)
    row = {
        "model": args.model, "platform": costs.platform, "batch_size": args.batch_size, "ram_budget_bytes": args.ram_budget,
        "solver_status": result.status, "predicted_peak_bytes": result.peak_ram_bytes, "predicted_runtime_s": result.runtime_s,
        "measured_peak_bytes": max(comparison.scheduled_peak_bytes), "plain_peak_bytes": max(comparison.plain_peak_bytes),
        "param_bytes": sum(p.numel() * p.element_size() for p in model.module.parameters()),
        **{k: v for k, v in comparison.to_dict().items() if not isinstance(v, list)},
    }
    if args.json:
        print(json.dumps(row, indent=2))
    else:
        print(
            f"{args.model} on {costs.platform}, {args.steps} steps under {int(args.ram_budget):,} bytes ({result.status} schedule: "
            f"{comparison.n_recomputes} recomputes, {comparison.n_pageouts} page-outs per step): losses and parameters "
            f"{'identical to plain PyTorch' if comparison.identical else 'DIFFER from plain PyTorch'}; peak without parameter gradients "
            f"{row['measured_peak_bytes']:,} bytes measured (plain PyTorch {row['plain_peak_bytes']:,}; simulator {result.peak_ram_bytes:,}); "
            f"step {statistics.median(comparison.scheduled_runtime_s) * 1e3:.4g} ms CPU + paging (plain {statistics.median(comparison.plain_cpu_s) * 1e3:.4g} ms CPU, "
            f"simulator {result.runtime_s * 1e3:.4g} ms; wall {statistics.median(comparison.scheduled_wall_s) * 1e3:.4g} ms, plain {statistics.median(comparison.plain_wall_s) * 1e3:.4g} ms)"
        )
    return 0 if comparison.identical else EXIT_NO_SCHEDULE


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _fraction(text: str) -> float:
    value = _positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, got {text!r}")
    return value


def _cmd_bittrain(args: argparse.Namespace) -> int:
    from poetlab.techniques.bittrain import measure_bittrain

    m = measure_bittrain(args.model, args.batch_size, args.relu_bias)
    if args.json:
        print(json.dumps({**asdict(m), "activation_reduction": m.activation_reduction, "training_memory_reduction": m.training_memory_reduction, "time_overhead": m.time_overhead}, indent=2))
        return 0
    print(
        f"BitTrain on {m.model} (batch {m.batch_size}, mean ReLU density {m.mean_relu_density:.3f}): saved activations "
        f"{m.saved_bytes:,} -> {m.stored_bytes:,} bytes ({m.activation_reduction:.1%} less; {m.n_compressed} compressed, {m.n_dense} dense); "
        f"parameters + step peak {m.param_bytes + m.peak_plain_bytes:,} -> {m.param_bytes + m.peak_bittrain_bytes:,} bytes "
        f"({m.training_memory_reduction:.1%} less); step time {m.plain_time_s:.3f} -> {m.bittrain_time_s:.3f} s ({m.time_overhead:+.0%}); "
        f"gradients {'identical' if m.gradients_equal else 'DIFFERENT'}"
    )
    return 0 if m.gradients_equal else 1


def _cmd_sparse_update(args: argparse.Namespace) -> int:
    from poetlab.techniques.sparse_update import measure_scheme, parse_scheme
    from poetlab.torch_models import build_torch_model

    built = build_torch_model(args.model, args.batch_size, 0)
    scheme = parse_scheme(args.scheme, built.module)
    m = measure_scheme(built.module, built.inputs, built.targets, scheme, inplace=args.inplace)
    if args.json:
        print(json.dumps({**asdict(m), "cost": {**asdict(m.cost), "total_bytes": m.cost.total_bytes}}, indent=2))
        return 0
    print(
        f"{scheme.name}{' + in-place' if m.inplace else ''} on {args.model} (batch {args.batch_size}): step peak {m.step_peak_bytes:,} bytes "
        f"(forward {m.forward_peak_bytes:,}, backward {m.backward_peak_bytes:,}); trainable parameters {m.trainable_param_bytes:,} bytes; "
        f"cost function {m.cost.total_bytes:,} bytes ({m.cost.saved_activation_bytes:,} saved activations + {m.cost.gradient_bytes:,} gradients)"
    )
    return 0


def _cmd_platforms(args: argparse.Namespace) -> int:
    for name in available_platforms(args.platform_dir):
        platform = load_platform(name, args.platform_dir)
        print(f"{name:<12} {platform.description}")
    print(f"{HOST:<12} this machine, measured by `poetlab profile --platform host` (profiles in data/profiles)")
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from poetlab.torch_models import TORCH_MODELS

    for name, spec in PAPER_MODELS.items():
        print(f"{name:<22} paper   {spec.description}")
    for name, torch_spec in TORCH_MODELS.items():
        print(f"{name:<22} traced  {torch_spec.description}")
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    from poetlab.profile import default_profile_path, profile_host
    from poetlab.torch_models import TORCH_MODELS

    if args.platform != HOST:
        raise InvalidArgumentError(f"only the host platform can be profiled (got {args.platform!r}); the paper platforms are coefficient files")
    if args.model is not None and args.model not in TORCH_MODELS:
        raise UnknownNameError("torch model", args.model, TORCH_MODELS)
    profile = profile_host(
        args.paging_dir, model=args.model, batch_size=args.batch_size, fuse=args.fuse, repeats=args.repeats,
        warmup=args.warmup, threads=args.threads, disk_repeats=args.disk_repeats, compute_power_w=args.compute_power_w,
        memory_power_w=args.memory_power_w, progress=sys.stderr.isatty(), clock=args.clock,
    )
    output = args.output or default_profile_path(args.model, args.fuse)
    profile.save(output)
    if args.json:
        print(json.dumps(profile.to_dict(), indent=1))
        return 0
    d, m = profile.disk, profile.machine
    rows = [
        ("machine", f"{m.cpu_model}, {m.logical_cores} logical cores, torch {m.torch_version} with {m.torch_threads} threads"),
        ("matmul rate", f"{profile.flops_per_s:.4g} flop/s ({profile.clock} clock)"),
        ("page-out", f"{d.pageout_latency_s * 1e3:.4g} ms + bytes / {d.pageout_throughput_bytes_per_s / 1e6:.4g} MB/s (write + fsync)"),
        ("page-in", f"{d.pagein_latency_s * 1e3:.4g} ms + bytes / {d.pagein_throughput_bytes_per_s / 1e6:.4g} MB/s ({d.cache_bypass})"),
        ("energy", f"{profile.energy_source}: compute {profile.compute_power_w:.4g} W, paging {d.power_w:.4g} W"),
    ]
    if profile.model is not None:
        t = profile.model
        rows.append(("model", f"{t.name} (batch {t.batch_size}{', fused' if t.fused else ''}): {len(t.nodes)} nodes"))
        forward = f" (forward pass {t.forward_runtime_s * 1e3:.4g} ms)" if t.forward_runtime_s is not None else ""
        rows.append(("step time", f"measured {t.step_runtime_s * 1e3:.4g} ms{forward}; nodes summed {t.node_runtime_sum_s * 1e3:.4g} ms (ratio {t.node_runtime_sum_s / t.step_runtime_s:.3f})"))
        slowdowns = [n.rerun_s / n.runtime_s for n in t.nodes if n.rerun_s is not None and n.runtime_s > 0]
        if slowdowns:
            rows.append(("reruns", f"{statistics.median(slowdowns):.3g}x a node's time alone (median of {len(slowdowns)} forward nodes, each rerun in the backward pass)"))
    rows.append(("written to", str(output)))
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="poetlab", description="POET: energy-optimal rematerialization and paging for on-device training")
    parser.add_argument("--version", action="version", version=f"poetlab {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and solver choices")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    graph = commands.add_parser("graph", help="summarise a model's training graph on a platform")
    _add_model_args(graph)
    graph.add_argument("--json", action="store_true", help="print one JSON object")
    graph.add_argument("--output", default=None, metavar="FILE", help="also write the training graph as JSON to FILE")
    graph.set_defaults(run=_cmd_graph)

    solve = commands.add_parser("solve", help="the minimum-energy remat + paging schedule within the budgets (the POET MILP)")
    _add_model_args(solve)
    solve.add_argument("--ram-budget", type=_positive_float, required=True, metavar="BYTES", help="RAM budget in bytes")
    solve.add_argument("--runtime-budget", type=float, default=None, metavar="FACTOR", help="runtime budget as a factor (>= 1) of one plain step; none by default")
    solve.add_argument("--no-paging", action="store_true", help="forbid paging (Checkmate's remat-only problem)")
    solve.add_argument("--no-remat", action="store_true", help="forbid recomputation (paging only)")
    solve.add_argument("--count-paging-time", action="store_true", help="fix: count paging time in the runtime budget")
    solve.add_argument("--charge-pagein", action="store_true", help="fix: a tensor being paged in holds RAM during its stage (prefetch)")
    solve.add_argument("--params-in-budget", action="store_true", help="fix: parameters and gradients count against the RAM budget")
    solve.add_argument("--compress", action="store_true", help="also allow keeping sparse tensors compressed (BitTrain's bitmap format) as a fourth choice")
    solve.add_argument("--density", type=_fraction, default=None, metavar="D", help="with --compress: density of every ReLU / max-pool output (default: measured on the model's torch twin)")
    solve.add_argument("--density-margin", type=float, default=0.1, metavar="M", help="with --compress: plan for densities this fraction above the profile (default 0.1)")
    solve.add_argument("--freeze-before", type=_positive_int, default=None, metavar="N", help="sparse update: freeze the layers before forward node N (the backward pass stops there)")
    solve.add_argument("--sparse-update", default=None, metavar="SCHEME", help="torch models: plan the step of Tiny Training's sparse-update scheme SCHEME applied for real (full, bias-only, last-K or sparse)")
    solve.add_argument("--solver", default="auto", help="auto (Gurobi when its license covers the model, else HiGHS), highs or gurobi")
    solve.add_argument("--time-limit", type=_positive_float, default=600.0, metavar="S", help="solver time limit in seconds (default 600)")
    solve.add_argument("--mip-gap", type=float, default=1e-4, metavar="G", help="relative MIP gap to stop at (default 1e-4)")
    solve.add_argument("--threads", type=_positive_int, default=None, metavar="N", help="solver threads (default: the solver's choice)")
    solve.add_argument("--json", action="store_true", help="print one JSON object")
    solve.add_argument("--plot", default=None, metavar="FILE", help="draw R, S_RAM, S_SSD and the memory trace to FILE (.png, .pdf, .svg)")
    solve.set_defaults(run=_cmd_solve)

    execute = commands.add_parser("execute", help="plan a traced torch model at a RAM budget and run it for real, beside plain PyTorch")
    _add_model_args(execute)
    execute.add_argument("--ram-budget", type=_positive_float, required=True, metavar="BYTES", help="RAM budget in bytes (activations; parameters and gradients outside)")
    execute.add_argument("--steps", type=_positive_int, default=1, help="SGD steps on the model's example batch (default 1)")
    execute.add_argument("--lr", type=_positive_float, default=0.01, help="SGD learning rate (default 0.01)")
    execute.add_argument("--time-limit", type=_positive_float, default=60.0, metavar="S", help="solver time limit in seconds (default 60)")
    execute.add_argument("--prefetch", action="store_true", help="page tensors in on a background thread, ahead of use")
    execute.add_argument("--paging-dir", default=None, metavar="DIR", help="where the private paging directory is made (default: the system's temporary directory)")
    execute.add_argument("--json", action="store_true", help="print one JSON object")
    execute.set_defaults(run=_cmd_execute)

    platforms = commands.add_parser("platforms", help="list the platforms")
    platforms.add_argument("--platform-dir", default=None, help="directory of platform YAML files")
    platforms.set_defaults(run=_cmd_platforms)

    technique = commands.add_parser("technique", help="measure BitTrain or Tiny Training's sparse update on a real PyTorch model")
    kinds = technique.add_subparsers(dest="technique", required=True, metavar="TECHNIQUE")
    bit = kinds.add_parser("bittrain", help="one training step with and without bitmap compression of saved activations")
    bit.add_argument("--model", default="resnet18_cifar_torch", help="torch model (default resnet18_cifar_torch)")
    bit.add_argument("--batch-size", type=_positive_int, default=8)
    bit.add_argument("--relu-bias", type=float, default=0.0, help="BatchNorm bias before each ReLU: negative makes activations sparser (default 0)")
    bit.add_argument("--json", action="store_true", help="print one JSON object")
    bit.set_defaults(run=_cmd_bittrain)
    sparse = kinds.add_parser("sparse-update", help="peak memory of one training step under a sparse-update scheme")
    sparse.add_argument("--model", default="mobilenetv2_torch", help="torch model (default mobilenetv2_torch: width 0.35, 128x128)")
    sparse.add_argument("--batch-size", type=_positive_int, default=1)
    sparse.add_argument("--scheme", default="sparse", help="full, bias-only, last-K or sparse (default sparse)")
    sparse.add_argument("--inplace", action="store_true", help="apply each SGD update during backward and free its gradient at once")
    sparse.add_argument("--json", action="store_true", help="print one JSON object")
    sparse.set_defaults(run=_cmd_sparse_update)

    models = commands.add_parser("models", help="list the models (paper layer lists and traced torch models)")
    models.set_defaults(run=_cmd_models)

    profile = commands.add_parser("profile", help="measure this machine (the host platform): node times, paging, power")
    profile.add_argument("--platform", default=HOST, help="only `host` can be profiled")
    profile.add_argument("--model", default=None, help="a torch model whose traced nodes to time (see `poetlab models`); none: disk and matmul only")
    profile.add_argument("--batch-size", type=_positive_int, default=1, help="batch size (default 1)")
    profile.add_argument("--fuse", action="store_true", help="time the fused graph's nodes")
    profile.add_argument("--paging-dir", default=".", metavar="DIR", help="directory on the device paging would use (default: the current directory)")
    profile.add_argument("--output", default=None, metavar="FILE", help="profile JSON (default: data/profiles/host-MODEL[-fused].json)")
    profile.add_argument("--repeats", type=_positive_int, default=3, help="timed runs per node, median taken (default 3)")
    profile.add_argument("--warmup", type=int, default=1, help="untimed runs before (default 1)")
    profile.add_argument("--threads", type=_positive_int, default=1, help="torch intra-op threads, pinned during profiling (default 1)")
    profile.add_argument("--disk-repeats", type=_positive_int, default=3, help="writes and reads per size (default 3)")
    profile.add_argument("--compute-power-w", type=_positive_float, default=None, metavar="W", help="modeled compute power when RAPL is not readable (default threads x 4.375 W)")
    profile.add_argument("--memory-power-w", type=_positive_float, default=5.0, metavar="W", help="modeled paging power when RAPL is not readable (default 5 W)")
    profile.add_argument("--clock", choices=("cpu", "wall"), default=None, help="node timing clock: cpu (thread CPU time, the default with one thread) or wall")
    profile.add_argument("--json", action="store_true", help="print the profile as JSON")
    profile.set_defaults(run=_cmd_profile)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        return args.run(args)
    except PoetlabError as exc:
        print(f"poetlab: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("poetlab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
