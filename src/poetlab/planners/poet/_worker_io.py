"""The worker side of the solver workers' protocol (``_highs_worker.py``, ``_cpsat_worker.py``), loaded by each by
its path (the workers run in isolated mode, ``python -I path PARENT_PID``, and import no poetlab).

:func:`begin` ties the worker's life to its parent's, reads the one pickled request on stdin and returns it with
the message stream: length-prefixed pickles (:func:`send`) on the file descriptor that was stdout, which from
then on is stderr, so a solver's console output can never corrupt the messages (the parent keeps stderr's last
line to explain a worker that died).

The worker dies with its parent, whose pid is its one argument: on Linux the kernel sends it SIGKILL when
the parent goes (``PR_SET_PDEATHSIG``), and elsewhere a watchdog thread ends it once its parent process is
gone (its parent pid is no longer that one, which also catches a parent gone before the guard was armed),
so a parent killed outright (SIGKILL, a crash) leaves no solve running on its own.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import struct
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
_WATCH_EVERY_S = 0.2


def send(stream, message: tuple) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(payload)) + payload)
    stream.flush()


def _die_with_parent(parent: int) -> None:
    """End this process when ``parent``, the process that started it, ends (see the module docstring)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass  # the watchdog below still holds
    if os.getppid() != parent:  # the parent went before the death signal was armed
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_WATCH_EVERY_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def begin(argv: list[str]) -> tuple[dict, object]:
    """Die with the parent (pid ``argv[0]``), read the request, and return it with the message stream."""
    _die_with_parent(int(argv[0]) if argv else os.getppid())
    request = pickle.load(sys.stdin.buffer)
    messages = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed from here on (the solver's log) goes to stderr
    return request, messages

