"""``python -m poetlab.reproduction check STAGE|all [PRESET] [--stamp FILE]``: check a stage's parameters
(``all``: every reproduction stage's) before any notebook runs; one line and exit code 2 when one is wrong.
``python -m poetlab.reproduction failed STAGE``: what a stage's command runs when it fails (``|| ...``): one
line saying how to restore the outputs DVC removed before it ran, and exit code 1.
``python -m poetlab.reproduction run STAGE [--parent PID] -- COMMAND...``: run a stage's notebook so that it
dies with DVC (:mod:`poetlab.reproduction.launcher`).

``dvc.yaml``'s ``params_check`` stage runs ``check all --stamp experiments/params_checked.txt`` and every
reproduction stage depends on that stamp, so DVC runs the check before it removes any stage's outputs: a
wrong value stops ``dvc repro`` there with the committed outputs in place. The stamp's text never changes,
so a passing check re-runs no stage whose own parameters did not change; it is written only when every
stage passes (atomically; the stage keeps it with ``persist``, so a failing check leaves the old one).
"""

from __future__ import annotations

import sys

from poetlab.core.files import write_text_atomic
from poetlab.errors import PoetlabError
from poetlab.reproduction.config import STAGES, stage_config
from poetlab.reproduction.launcher import RESTORE_HINT, run_stage

USAGE = (
    "usage: python -m poetlab.reproduction check STAGE|all [PRESET] [--stamp FILE] | failed STAGE"
    " | run STAGE [--parent PID] -- COMMAND..."
)
STAMP_TEXT = "every reproduction stage's parameters in params.yaml passed `python -m poetlab.reproduction check all`\n"


def main(argv: list[str]) -> int:
    argv = list(argv)
    if len(argv) == 2 and argv[0] == "failed":
        print(f"dvc repro: stage {argv[1]} failed; {RESTORE_HINT}", file=sys.stderr)
        return 1
    if argv[:1] == ["run"]:
        return _run(argv[1:])
    stamp = None
    if "--stamp" in argv:
        at = argv.index("--stamp")
        if at + 1 >= len(argv):
            print(USAGE, file=sys.stderr)
            return 2
        stamp = argv[at + 1]
        del argv[at : at + 2]
    if len(argv) not in (2, 3) or argv[0] != "check":
        print(USAGE, file=sys.stderr)
        return 2
    stages = tuple(STAGES) if argv[1] == "all" else (argv[1],)
    try:
        for stage in stages:
            stage_config(stage, argv[2] if len(argv) == 3 else None)
        if stamp is not None:
            write_text_atomic(stamp, STAMP_TEXT)
    except PoetlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _run(argv: list[str]) -> int:
    """``run STAGE [--parent PID] -- COMMAND...`` (an empty PID, as a shell without ``$PPID`` gives: watch the
    launcher's own parent)."""
    if "--" not in argv:
        print(USAGE, file=sys.stderr)
        return 2
    at = argv.index("--")
    head, command = argv[:at], argv[at + 1 :]
    parent = None
    if len(head) == 3 and head[1] == "--parent" and (head[2] == "" or head[2].isdigit()):
        parent = int(head[2]) if head[2] else None
    elif len(head) != 1:
        head = []
    if not head or not command:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        return run_stage(head[0], command, parent)
    except PoetlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
