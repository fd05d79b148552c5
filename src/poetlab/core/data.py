"""Where the kit's data lives (measured host profiles, kept schedules): ``$POETLAB_DATA`` when set, else the nearest
``data/`` folder in the working directory or above it (a checkout's, wherever the command runs inside it).
The package never locates data by its own path, so an installed poetlab works on any data folder. (The paper's
platforms are not data: they ship inside the package, see :data:`poetlab.core.platforms.BUILTIN_PLATFORM_DIR`.)"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "POETLAB_DATA"


def data_dir() -> Path:
    """The data folder: ``$POETLAB_DATA``, else ``data/`` in the working directory or its nearest parent
    that has one, else ``./data`` (whose absence the caller reports, naming ``POETLAB_DATA``)."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env)
    here = Path.cwd()
    for folder in (here, *here.parents):
        if (folder / "data").is_dir():
            return folder / "data"
    return here / "data"
