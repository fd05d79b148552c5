"""Progress bars for what a person waits for, kept out of outputs nobody watches.

Every bar of the package comes from :func:`progress_bar`: tqdm.auto's, a widget in JupyterLab (ipywidgets,
from the `pipeline` extra) and text in a terminal. Without ipywidgets a notebook gets text bars instead of
tqdm.auto's "IProgress not found" warning. The pipeline runs its notebooks with ``POETLAB_PROGRESS=0``
(dvc.yaml): a notebook executed by papermill has no one watching it, and its bars would be saved in the
committed notebook (hundreds of stderr lines, or widget state), so there every bar is off; log lines
(which solver ran, a time limit ignored) still go to the notebook.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from typing import Any

PROGRESS_ENV = "POETLAB_PROGRESS"
_OFF = {"0", "false", "no", "off"}


def progress_enabled() -> bool:
    """False when ``$POETLAB_PROGRESS`` is 0 / false / no / off (any case): every bar is then disabled."""
    return os.environ.get(PROGRESS_ENV, "").strip().lower() not in _OFF


def progress_bar(iterable: Iterable[Any] | None = None, *, disable: bool | None = False, **kwargs: Any):
    """``tqdm(iterable, disable=disable, **kwargs)`` with tqdm.auto's class where ipywidgets can draw it
    (else tqdm's text bar), disabled whatever ``disable`` says when :func:`progress_enabled` is false.
    ``disable=None`` is tqdm's: off when not on a terminal (a widget in a notebook is always drawn)."""
    if importlib.util.find_spec("ipywidgets") is None:
        from tqdm.std import tqdm
    else:
        from tqdm.auto import tqdm
    return tqdm(iterable, disable=True if not progress_enabled() else disable, **kwargs)
