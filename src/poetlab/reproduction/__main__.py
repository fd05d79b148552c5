"""``python -m poetlab.reproduction check STAGE [PRESET]``: check a stage's parameters before its
notebook runs; one line and exit code 2 when one is wrong, so that a bad value leaves no partial output."""

from __future__ import annotations

import sys

from poetlab.errors import PoetlabError
from poetlab.reproduction.config import stage_config


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or argv[0] != "check":
        print("usage: python -m poetlab.reproduction check STAGE [PRESET]", file=sys.stderr)
        return 2
    try:
        stage_config(argv[1], argv[2] if len(argv) == 3 else None)
    except PoetlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
