"""Errors meant for people: one line naming the fix, of a kind a caller can catch (PoetlabError, and the
built-in kind it is: ValueError for bad values, OSError for outputs), exit code 2 from the CLI."""

from __future__ import annotations

import pytest

from poetlab import load_platform
from poetlab.errors import GraphFileError, InvalidArgumentError, OutputError, PlatformSpecError, PoetlabError, ScheduleFileError, UnknownNameError


def test_an_unknown_name_lists_the_valid_ones_sorted():
    error = UnknownNameError("model", "resnet", ["vgg16", "bert", "linear"])
    assert str(error) == "unknown model 'resnet'; valid models: bert, linear, vgg16"
    assert error.valid == ("bert", "linear", "vgg16") and error.kind == "model" and error.name == "resnet"


@pytest.mark.parametrize(
    "kind,builtin",
    [(UnknownNameError, ValueError), (InvalidArgumentError, ValueError), (PlatformSpecError, ValueError),
     (GraphFileError, ValueError), (ScheduleFileError, ValueError), (OutputError, OSError)],
)
def test_every_error_is_a_poetlab_error_and_its_builtin_kind(kind, builtin):
    assert issubclass(kind, PoetlabError) and issubclass(kind, builtin)


def test_the_api_raises_them_and_the_cli_prints_them_as_one_line(run_cli):
    with pytest.raises(UnknownNameError, match="valid platforms: a72"):
        load_platform("nosuch")
    result = run_cli("graph", "--model", "linear", "--platform", "nosuch")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "unknown platform 'nosuch'" in result.stderr
    assert "Traceback" not in result.stderr
