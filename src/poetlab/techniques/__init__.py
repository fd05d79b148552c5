"""On-device training techniques beside POET, each in its own module that starts with its reference and
what is and is not reproduced: :mod:`~poetlab.techniques.bittrain` (bitmap compression of saved
activations), :mod:`~poetlab.techniques.sparse_update` (Tiny Training's sparse update, QAS and in-place
updates; :mod:`~poetlab.techniques.transfer` its accuracy run), :mod:`~poetlab.techniques.compression`
(compression as a fourth choice of the POET MILP), :mod:`~poetlab.techniques.transforms` (sparse update
and autograd's saved tensors as graph transformations), :mod:`~poetlab.techniques.frontier` (the
memory-vs-energy frontier table and figure), :mod:`~poetlab.techniques.memory` (allocator-measured peaks)."""
