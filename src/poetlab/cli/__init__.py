"""The ``poetlab`` command: a thin shell over the package's functions.

Errors a person can fix (a :class:`~poetlab.errors.PoetlabError`) are printed as one line on stderr
and exit with code 2, as argparse does for bad flags. SIGTERM ends a command as Ctrl-C (SIGINT) does: the
exception unwinds through every ``finally``, so a HiGHS worker is killed with its parent and the page
files of ``poetlab execute`` are removed, and the command exits 143 (128 + SIGTERM) with one line.

Standard output carries the command's own output only (``--json`` is parsed by other programs): native
libraries that print to file descriptor 1 (scipy's bundled HiGHS writes a debugging line there on some
covering problems) write to stderr instead, see :func:`_python_only_stdout`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import io
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from poetlab import __version__
from poetlab.errors import PoetlabError
from poetlab.core.platforms import HOST

from poetlab.cli.common import (
    EXIT_USAGE,
    OneLineParser,
    add_model_args,
    batch_size,
    budget_bytes,
    finite_float,
    fraction,
    positive_float,
    positive_int,
    threads,
)
from poetlab.cli.execute import cmd_execute
from poetlab.cli.graph import cmd_graph
from poetlab.cli.listing import cmd_models, cmd_platforms
from poetlab.cli.profile import cmd_profile
from poetlab.cli.solve import cmd_solve
from poetlab.cli.sweep import cmd_sweep
from poetlab.cli.technique import cmd_bittrain, cmd_sparse_update


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="poetlab", description="POET: energy-optimal rematerialization and paging for on-device training")
    parser.add_argument("--version", action="version", version=f"poetlab {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and solver choices")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    graph = commands.add_parser("graph", help="summarise a model's training graph on a platform")
    add_model_args(graph)
    graph.add_argument("--json", action="store_true", help="print one JSON object")
    graph.add_argument("--output", default=None, metavar="FILE", help="also write the training graph as JSON to FILE")
    graph.set_defaults(run=cmd_graph)

    solve = commands.add_parser("solve", help="the minimum-energy remat + paging schedule within the budgets (the POET MILP)")
    add_model_args(solve)
    solve.add_argument("--ram-budget", type=budget_bytes, required=True, metavar="BYTES", help="RAM budget in bytes")
    solve.add_argument("--runtime-budget", type=finite_float, default=None, metavar="FACTOR", help="runtime budget as a factor (>= 1) of one plain step; none by default")
    solve.add_argument("--no-paging", action="store_true", help="forbid paging (Checkmate's remat-only problem)")
    solve.add_argument("--no-remat", action="store_true", help="forbid recomputation (paging only)")
    solve.add_argument("--count-paging-time", action="store_true", help="fix: count paging time in the runtime budget")
    solve.add_argument("--charge-pagein", action="store_true", help="fix: a tensor being paged in holds RAM during its stage (prefetch)")
    solve.add_argument("--params-in-budget", action="store_true", help="fix: parameters and gradients count against the RAM budget")
    solve.add_argument("--compress", action="store_true", help="also allow keeping sparse tensors compressed (BitTrain's bitmap format) as a fourth choice")
    solve.add_argument("--density", type=fraction, default=None, metavar="D", help="with --compress: density of every ReLU / max-pool output (default: measured on the model's torch twin)")
    solve.add_argument("--density-margin", type=finite_float, default=0.1, metavar="M", help="with --compress: plan for densities this fraction above the profile (default 0.1)")
    solve.add_argument("--freeze-before", type=positive_int, default=None, metavar="N", help="sparse update: freeze the layers before forward node N (the backward pass stops there)")
    solve.add_argument("--sparse-update", default=None, metavar="SCHEME", help="torch models: plan the step of Tiny Training's sparse-update scheme SCHEME applied for real (full, bias-only, last-K or sparse)")
    solve.add_argument("--solver", default="auto", help="auto (Gurobi when its license covers the model, else HiGHS), highs or gurobi")
    solve.add_argument("--time-limit", type=positive_float, default=600.0, metavar="S", help="solver time limit in seconds (default 600)")
    solve.add_argument("--mip-gap", type=finite_float, default=1e-4, metavar="G", help="relative MIP gap to stop at (default 1e-4)")
    solve.add_argument("--threads", type=threads, default=None, metavar="N", help="solver threads (default: the solver's choice)")
    solve.add_argument("--json", action="store_true", help="print one JSON object")
    solve.add_argument("--plot", default=None, metavar="FILE", help="draw R, S_RAM, S_SSD and the memory trace to FILE (.png, .pdf, .svg)")
    solve.set_defaults(run=cmd_solve)

    execute = commands.add_parser("execute", help="plan a traced torch model at a RAM budget and run it for real, beside plain PyTorch")
    add_model_args(execute)
    execute.add_argument("--ram-budget", type=budget_bytes, required=True, metavar="BYTES", help="RAM budget in bytes (activations; parameters and gradients outside)")
    execute.add_argument("--steps", type=positive_int, default=1, help="SGD steps on the model's example batch (default 1)")
    execute.add_argument("--lr", type=positive_float, default=0.01, help="SGD learning rate (default 0.01)")
    execute.add_argument("--time-limit", type=positive_float, default=60.0, metavar="S", help="solver time limit in seconds (default 60)")
    execute.add_argument("--prefetch", action="store_true", help="page tensors in on a background thread, ahead of use")
    execute.add_argument("--paging-dir", default=None, metavar="DIR", help="where the private paging directory is made (default: the system's temporary directory)")
    execute.add_argument("--json", action="store_true", help="print one JSON object")
    execute.set_defaults(run=cmd_execute)

    platforms = commands.add_parser("platforms", help="list the platforms")
    platforms.add_argument("--platform-dir", default=None, help="directory of platform YAML files")
    platforms.set_defaults(run=cmd_platforms)

    technique = commands.add_parser("technique", help="measure BitTrain or Tiny Training's sparse update on a real PyTorch model")
    kinds = technique.add_subparsers(dest="technique", required=True, metavar="TECHNIQUE")
    bit = kinds.add_parser("bittrain", help="one training step with and without bitmap compression of saved activations")
    bit.add_argument("--model", default="resnet18_cifar_torch", help="torch model (default resnet18_cifar_torch)")
    bit.add_argument("--batch-size", type=batch_size, default=8)
    bit.add_argument("--relu-bias", type=finite_float, default=0.0, help="BatchNorm bias before each ReLU: negative makes activations sparser (default 0)")
    bit.add_argument("--json", action="store_true", help="print one JSON object")
    bit.set_defaults(run=cmd_bittrain)
    sparse = kinds.add_parser("sparse-update", help="peak memory of one training step under a sparse-update scheme")
    sparse.add_argument("--model", default="mobilenetv2_torch", help="torch model (default mobilenetv2_torch: width 0.35, 128x128)")
    sparse.add_argument("--batch-size", type=batch_size, default=1)
    sparse.add_argument("--scheme", default="sparse", help="full, bias-only, last-K or sparse (default sparse)")
    sparse.add_argument("--inplace", action="store_true", help="apply each SGD update during backward and free its gradient at once")
    sparse.add_argument("--json", action="store_true", help="print one JSON object")
    sparse.set_defaults(run=cmd_sparse_update)

    sweep = commands.add_parser("sweep", help="one reproduction stage's sweep outside DVC, on local processes or a Dask cluster")
    sweep.add_argument("stage", metavar="STAGE", help="baselines, fig3_frontier, fig4_runtime, fig5_capuchin or table3_pofo")
    sweep.add_argument("--preset", default=None, help="params.yaml preset (default: its active `preset:`)")
    sweep.add_argument("--cluster", default=None, metavar="ADDRESS", help="Dask scheduler, tcp://HOST:PORT (default: $POETLAB_CLUSTER, else cluster.address in params.yaml, else local processes)")
    sweep.add_argument("--params", default="params.yaml", metavar="FILE", help="the parameters file (default params.yaml)")
    sweep.add_argument("--out", required=True, metavar="DIR", help="writes DIR/results/STAGE.{csv,md} and DIR/metrics/STAGE.json")
    sweep.set_defaults(run=cmd_sweep)

    models = commands.add_parser("models", help="list the models (paper layer lists and traced torch models)")
    models.set_defaults(run=cmd_models)

    profile = commands.add_parser("profile", help="measure this machine (the host platform): node times, paging, power")
    profile.add_argument("--platform", default=HOST, help="only `host` can be profiled")
    profile.add_argument("--model", default=None, help="a torch model whose traced nodes to time (see `poetlab models`) or path/to/file.py:FUNCTION; none: disk and matmul only")
    profile.add_argument("--batch-size", type=batch_size, default=1, help="batch size (default 1)")
    profile.add_argument("--fuse", action="store_true", help="time the fused graph's nodes")
    profile.add_argument("--paging-dir", default=".", metavar="DIR", help="directory on the device paging would use (default: the current directory)")
    profile.add_argument("--output", default=None, metavar="FILE", help="profile JSON (default: data/profiles/host-MODEL[-fused].json)")
    profile.add_argument("--repeats", type=positive_int, default=3, help="timed runs per node, median taken (default 3)")
    profile.add_argument("--warmup", type=int, default=1, help="untimed runs before (default 1)")
    profile.add_argument("--threads", type=threads, default=1, help="torch intra-op threads, pinned during profiling (default 1)")
    profile.add_argument("--disk-repeats", type=positive_int, default=3, help="writes and reads per size (default 3)")
    profile.add_argument("--compute-power-w", type=positive_float, default=None, metavar="W", help="modeled compute power when RAPL is not readable (default threads x 4.375 W)")
    profile.add_argument("--memory-power-w", type=positive_float, default=5.0, metavar="W", help="modeled paging power when RAPL is not readable (default 5 W)")
    profile.add_argument("--clock", choices=("cpu", "wall"), default=None, help="node timing clock: cpu (thread CPU time, the default with one thread) or wall")
    profile.add_argument("--json", action="store_true", help="print the profile as JSON")
    profile.set_defaults(run=cmd_profile)
    return parser


class _Terminated(BaseException):
    """SIGTERM arrived: a BaseException, like KeyboardInterrupt, so no ``except Exception`` swallows it."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    with _python_only_stdout():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    guarded = _GuardedStdout(sys.stdout)
    sys.stdout = guarded
    on_main_thread = threading.current_thread() is threading.main_thread()  # only there can a handler be set
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if on_main_thread else None
    try:
        code = args.run(args)
        guarded.flush()
        return code
    except PoetlabError as exc:
        print(f"poetlab: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("poetlab: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("poetlab: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except _StdoutError as exc:
        # stdout closed (`| head -1`: quiet, as Unix tools are) or full (`> /dev/full`: one line).
        _silence_stdout(guarded.stream)
        if not isinstance(exc.error, BrokenPipeError):
            print(f"poetlab: error: cannot write the output: {exc.error.strerror or exc.error}", file=sys.stderr)
        return 1
    finally:
        sys.stdout = guarded.stream
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def _python_only_stdout():
    """For the command's duration, ``sys.stdout`` writes to a duplicate of standard output and file descriptor 1
    points at stderr, so that what native code prints there (C's printf from a bundled solver) cannot land
    inside the command's output; C's buffered output is flushed to stderr before descriptor 1 is restored.
    Nothing changes where ``sys.stdout`` is not descriptor 1 (a caller's capture, an embedding program)."""
    original = sys.stdout
    duplicate = _stdout_moved_aside(original)
    if duplicate is None:
        yield
        return
    stream = io.TextIOWrapper(
        io.FileIO(duplicate, "w", closefd=False), encoding=original.encoding, errors=original.errors, line_buffering=original.line_buffering,
    )
    sys.stdout = stream
    try:
        yield
    finally:
        try:
            stream.close()  # (closes the wrapper even where its flush fails, so nothing writes to the descriptor once closed)
        except OSError:  # (a closed pipe: _run has already said so, or stays quiet as Unix tools do)
            pass
        sys.stdout = original
        _flush_c_stdio()
        os.dup2(duplicate, 1)  # (after _silence_stdout, the duplicate is /dev/null: the exit's flush stays quiet)
        os.close(duplicate)


def _stdout_moved_aside(original) -> int | None:
    """A duplicate of descriptor 1, which now points at stderr; None (nothing changed) where ``original`` is not
    descriptor 1 or a descriptor cannot be had (none left, stderr closed)."""
    try:
        if original.fileno() != 1:
            return None
        original.flush()
        duplicate = os.dup(1)
    except (AttributeError, OSError, ValueError):  # (io.UnsupportedOperation is both OSError and ValueError)
        return None
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(duplicate)
        return None
    return duplicate


def _flush_c_stdio() -> None:
    """fflush(NULL): what native code printed with C's buffered stdio goes out now, to where descriptor 1 points."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # (no C library by that name, e.g. on Windows)
        pass


class _StdoutError(Exception):
    """Standard output could not be written (a closed pipe, a full disk)."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


class _GuardedStdout:
    """Standard output whose write errors are told apart from any other OSError of a command."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self._open().write(text)
        except OSError as exc:
            raise _StdoutError(exc) from None

    def flush(self) -> None:
        try:
            self._open().flush()
        except OSError as exc:
            raise _StdoutError(exc) from None

    def _open(self):
        if self.stream is None:  # (Python's sys.stdout where the command started with descriptor 1 closed: `>&-`)
            raise OSError(errno.EBADF, "standard output is closed")
        return self.stream

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def _silence_stdout(stream) -> None:
    """Point standard output at /dev/null, so that the interpreter's own flush at exit, finding the same
    closed pipe or full disk, does not print a second error."""
    if stream is None:
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
