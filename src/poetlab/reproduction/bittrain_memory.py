"""BitTrain's headline (Hosny et al., SEC 2021): bitmap compression of the activations saved for the
backward pass cuts training memory "up to 34% at a sparsity level of 50%" and "up to 56%" above 70%.

We measure it on a network we train here, so that the sparsity is the one training produces, not one we
set: :class:`poetlab.torch.finetune.DigitsCNN` trained with SGD on scikit-learn's packaged digits (no
download). At several points of training, one step on a fixed batch is run with and without
:func:`poetlab.techniques.bittrain.bittrain`: the ReLU outputs' measured sparsity, the saved activations
dense and as BitTrain keeps them, the allocator peak of the whole step, and whether every gradient is
bit-identical. The format is the paper's (1 bit per element plus the non-zeros), in float32; the paper's
own kernels and pruning are not reproduced (see :mod:`poetlab.techniques.bittrain`)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

#: "up to 34% reduction in the memory footprint at a sparsity level of 50%", "up to 56%" above 70%
PAPER_REDUCTION_AT_50 = 0.34
PAPER_REDUCTION_ABOVE_70 = 0.56


def bittrain_table(width: int, depth: int, batch_size: int, checkpoints: Sequence[int], lr: float = 0.05, seed: int = 0) -> pd.DataFrame:
    """One row per training checkpoint (SGD steps taken so far, ascending): train a DigitsCNN on the
    digits up to each checkpoint, then measure one step on the first batch with and without BitTrain."""
    import torch
    from torch import nn

    from poetlab.techniques.bittrain import BitTrainStats, bittrain
    from poetlab.techniques.memory import measure_peak_bytes, parameter_bytes
    from poetlab.torch.finetune import DigitsCNN, digits_batches

    torch.manual_seed(seed)
    module = DigitsCNN(width=width, depth=depth)
    batches = digits_batches(batch_size, max(checkpoints) + 1, seed=seed)
    probe_x, probe_y = batches[0]
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
    relus = [m for m in module.modules() if isinstance(m, nn.ReLU)]

    def step() -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # the same dropout mask with and without BitTrain
            loss_fn(module(probe_x), probe_y).backward()

    def measure(taken: int) -> dict[str, object]:
        densities: list[float] = []
        hooks = [m.register_forward_hook(lambda _m, _i, out: densities.append(float(torch.count_nonzero(out)) / out.numel())) for m in relus]
        module.zero_grad(set_to_none=True)
        step()
        for hook in hooks:
            hook.remove()
        plain_grads = [p.grad.clone() for p in module.parameters()]
        module.zero_grad(set_to_none=True)
        plain_peak = measure_peak_bytes(step).peak_bytes
        stats = BitTrainStats()
        module.zero_grad(set_to_none=True)
        with bittrain(stats=stats):
            packed_peak = measure_peak_bytes(step).peak_bytes
        equal = all(torch.equal(a, p.grad) for a, p in zip(plain_grads, module.parameters(), strict=True))
        with torch.no_grad():
            module.eval()
            everything = torch.cat([x for x, _ in batches[: max(1, 1797 // batch_size)]])
            labels = torch.cat([y for _, y in batches[: max(1, 1797 // batch_size)]])
            accuracy = float((module(everything).argmax(1) == labels).float().mean())
            module.train()
        return {
            "steps": taken, "batch_size": batch_size, "train_accuracy": accuracy,
            "relu_sparsity": 1 - sum(densities) / len(densities),
            "saved_bytes": stats.saved_bytes, "stored_bytes": stats.stored_bytes,
            "activation_reduction": stats.reduction, "n_compressed": stats.n_compressed, "n_dense": stats.n_dense,
            "param_bytes": parameter_bytes(module), "step_peak_plain_bytes": plain_peak, "step_peak_bittrain_bytes": packed_peak,
            "gradients_equal": equal,
        }

    rows = []
    taken = 0
    for checkpoint in sorted(checkpoints):
        for x, y in batches[taken:checkpoint]:
            optimizer.zero_grad(set_to_none=True)
            loss_fn(module(x), y).backward()
            optimizer.step()
        taken = checkpoint
        rows.append(measure(taken))
    table = pd.DataFrame(rows)
    table["training_memory_reduction"] = 1 - (table.param_bytes + table.step_peak_bittrain_bytes) / (table.param_bytes + table.step_peak_plain_bytes)
    return table


def bittrain_metrics(table: pd.DataFrame) -> dict[str, object]:
    """The trained network (the last checkpoint): its sparsity and both reductions; all checkpoints' gradients equal."""
    last = table.iloc[-1]
    return {
        "steps": int(last.steps), "train_accuracy": float(last.train_accuracy), "relu_sparsity": float(last.relu_sparsity),
        "activation_reduction": float(last.activation_reduction), "training_memory_reduction": float(last.training_memory_reduction),
        "max_relu_sparsity": float(table.relu_sparsity.max()), "gradients_equal": bool(table.gradients_equal.all()),
    }
