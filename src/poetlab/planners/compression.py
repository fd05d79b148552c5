"""Schedules that keep idle outputs compressed in RAM (the MILP's fourth choice): BitTrain's policy as a
schedule, and the starts the compression MILP is given. Pure schedule transformations (numpy only), so
the solver imports them without pulling in torch; the costs they read come from
:func:`poetlab.techniques.compression.compression_costs`."""

from __future__ import annotations

import numpy as np

from poetlab.core.costs import CompressionCosts
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import Schedule, checkpoint_all_schedule


def compress_idle(schedule: Schedule, graph: TrainingGraph, compression: CompressionCosts) -> Schedule:
    """``schedule`` with every output that compression allows kept compressed while it sits idle in RAM:
    between two stages that read it (or page it out) at least three stages apart, it is compressed at
    the start of the stage after the first read and decompressed at the end of the stage before the
    next, in the MILP's stage semantics. The computes are unchanged, so the energy rises by the
    compression costs while the memory falls; applied to BitTrain's policy on checkpoint-all
    (:func:`compress_all_schedule`) or to a POET schedule solved at a looser budget, it gives a start
    for the compression MILP at a tighter one. Replay the result with :func:`poetlab.simulate`."""
    m = schedule.matrices()
    R, S_RAM = np.array(m.R, dtype=bool), np.array(m.S_RAM, dtype=bool)
    stages, T = R.shape
    S_CMP, M_CMP, M_DCMP = (np.zeros((stages, T), dtype=bool) if x is None else np.array(x, dtype=bool) for x in (m.S_CMP, m.M_CMP, m.M_DCMP))
    if M_CMP.any():
        return schedule  # already uses compression
    read = np.zeros((stages, T), dtype=bool)
    for k, node in enumerate(graph.nodes):
        for i in set(node.inputs):
            read[:, i] |= R[:, k]
    read |= np.asarray(m.M_OUT, dtype=bool) | R
    for i in np.flatnonzero(compression.allowed):
        if graph.nodes[i].is_backward:
            continue
        t = 0
        while t < stages:
            if not S_RAM[t, i] and not R[t, i]:
                t += 1
                continue
            # a stretch in which i stays in RAM: from stage t while S_RAM holds it at the next start
            end = t
            while end + 1 < stages and S_RAM[end + 1, i]:
                end += 1
            uses = [u for u in range(t, end + 1) if read[u, i]]
            for first, second in zip(uses, uses[1:]):
                if second - 1 >= first + 2:
                    M_CMP[first + 1, i] = True
                    S_CMP[first + 2 : second + 1, i] = True
                    S_RAM[first + 2 : second, i] = False
                    M_DCMP[second - 1, i] = True
            t = end + 1
    return Schedule.from_matrices(
        graph, R, S_RAM, m.S_SSD, m.M_IN, m.M_OUT, S_CMP=S_CMP, M_CMP=M_CMP, M_DCMP=M_DCMP,
    )


def compress_all_schedule(graph: TrainingGraph, compression: CompressionCosts) -> Schedule:
    """Checkpoint-all with every output that compression allows kept compressed while idle (BitTrain's
    policy as a schedule of the fourth choice; :func:`compress_idle`). It computes every node once, so
    its energy is one plain step plus the compression costs."""
    return compress_idle(checkpoint_all_schedule(graph), graph, compression)
