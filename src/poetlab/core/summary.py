"""One-line facts about a training graph on a platform: what ``poetlab graph`` prints."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph


@dataclass(frozen=True)
class GraphSummary:
    """Sizes of a training graph and the costs of one plain step (no recomputation, no paging).

    ``n_edges`` counts input references as the release does (its first gradient node reads the loss
    twice); ``n_unique_edges`` counts distinct producer/consumer pairs.
    """

    model: str
    platform: str
    batch_size: int | None
    n_nodes: int
    n_forward: int
    n_backward: int
    n_edges: int
    n_unique_edges: int
    total_runtime_s: float
    forward_ram_bytes: int
    peak_tensor_bytes: int
    plain_step_energy_j: float
    param_bytes: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def summarize_graph(graph: TrainingGraph, costs: CostModel) -> GraphSummary:
    batch_size = graph.metadata.get("batch_size")
    return GraphSummary(
        model=graph.name,
        platform=costs.platform,
        batch_size=int(batch_size) if isinstance(batch_size, int) else None,
        n_nodes=graph.n_nodes,
        n_forward=len(graph.forward_indices),
        n_backward=len(graph.backward_indices),
        n_edges=graph.n_edges,
        n_unique_edges=graph.n_unique_edges,
        total_runtime_s=costs.plain_step_runtime_s,
        forward_ram_bytes=graph.forward_bytes,
        peak_tensor_bytes=int(graph.output_bytes.max()),
        plain_step_energy_j=costs.plain_step_energy_j,
        param_bytes=graph.param_bytes,
    )
