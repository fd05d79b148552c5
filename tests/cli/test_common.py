"""What every command shares: the argument types (one-line refusals), the one-line usage error, and the
model and costs a command's flags name."""

from __future__ import annotations

import argparse

import pytest

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.cli.common import (
    EXIT_USAGE,
    MAX_BUDGET_BYTES,
    OneLineParser,
    add_model_args,
    budget_bytes,
    finite_float,
    fraction,
    graph_and_costs,
    model_graph,
    positive_float,
    positive_int,
)
from poetlab.errors import InvalidArgumentError, UnknownNameError


@pytest.mark.parametrize(
    "parse,text,value",
    [(positive_int, "3", 3), (positive_float, "2.5", 2.5), (positive_float, "1e6", 1e6), (budget_bytes, "1e6", 1e6),
     (finite_float, "-1.5", -1.5), (fraction, "0.25", 0.25)],
)
def test_argument_types_take_their_domain(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize(
    "parse,text,message",
    [
        (positive_int, "0", "expected a positive integer, got '0'"),
        (positive_int, "2.5", "expected a positive integer"),
        (lambda t: positive_int(t, 4), "5", "expected a positive integer up to 4"),
        (positive_float, "inf", "expected a positive number"),
        (positive_float, "-1", "expected a positive number"),
        (budget_bytes, str(2 * MAX_BUDGET_BYTES), r"from 1 to 1125899906842624 \(1 PiB\)"),
        (finite_float, "nan", "expected a finite number"),
        (finite_float, "x", "expected a number"),
        (fraction, "1", "expected a fraction between 0 and 1"),
    ],
)
def test_argument_types_refuse_the_rest_in_one_line(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message) as info:
        parse(text)
    assert "\n" not in str(info.value)


def test_a_usage_error_is_one_line_and_exit_2(capsys):
    parser = OneLineParser(prog="poetlab x")
    parser.add_argument("--n", type=positive_int, required=True)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--n", "-1"])
    assert info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("poetlab x: error: argument --n: expected a positive integer") and "(see poetlab x --help)" in err


def test_the_model_flags_give_the_graph_and_its_flop_costs():
    parser = OneLineParser(prog="poetlab x")
    add_model_args(parser)
    args = parser.parse_args(["--model", "linear", "--platform", "m0", "--batch-size", "2"])
    graph, costs = graph_and_costs(args)
    assert graph == build_paper_graph("linear", 2)
    expected = CostModel.from_flops(graph, load_platform("m0"))
    assert costs.platform == "m0" and (costs.runtime_s == expected.runtime_s).all()


def test_model_graph_names_what_is_wrong():
    assert model_graph("linear", 1, False) == build_paper_graph("linear")
    with pytest.raises(InvalidArgumentError, match="--fuse applies to traced torch models; linear is a paper model"):
        model_graph("linear", 1, True)
    with pytest.raises(UnknownNameError, match="unknown model 'nosuch'.*resnet18_cifar_torch"):
        model_graph("nosuch", 1, False)
