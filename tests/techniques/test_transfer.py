"""Transfer learning on the digits task: packaged and split as documented, and sparse update learns it."""

from __future__ import annotations

import pytest

from poetlab.techniques.sparse_update import (
    tiny_training_scheme,
)
from poetlab.torch.models import MobileNetV2


def test_digits_task_is_packaged_and_split():
    from poetlab.techniques.transfer import load_digits_task

    train, test = load_digits_task((5, 6, 7, 8, 9), side=16)
    assert train.x.shape[1:] == (3, 16, 16) and set(train.y.tolist()) == {0, 1, 2, 3, 4}
    assert len(train.y) + len(test.y) == 896  # the digits 5-9 of scikit-learn's 1797


@pytest.mark.slow
def test_sparse_update_learns_a_new_task():
    from poetlab.techniques.transfer import digits_transfer

    source, results = digits_transfer((tiny_training_scheme(MobileNetV2(5, 0.35)),), pretrain_epochs=2, finetune_epochs=1)
    assert source > 0.5 and results[0].test_accuracy > 0.4  # chance is 0.2
