"""Solver worker scripts that exit without an answer, each with the stderr line the error must name (the HiGHS and
CP-SAT workers' tests: a worker that dies is an error, never a time-out)."""

DEAD_WORKERS = [
    ("import sys\nprint('starting', file=sys.stderr)\nprint('MemoryError: out of memory', file=sys.stderr)\nsys.exit(3)\n", "MemoryError: out of memory"),
    ("import sys; sys.stdin.buffer.read()\n", "no output on stderr"),  # exits 0 without an answer
]
