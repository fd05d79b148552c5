"""Errors meant for people.

Every error that bad input can cause is a :class:`PoetlabError` whose message is one line that says
what is wrong and how to fix it. The CLI prints that line and exits with code 2; Python users get the
exception itself. Anything else that escapes is a bug in poetlab and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


class PoetlabError(Exception):
    """Base class: a problem with the input that the user can fix."""


class UnknownNameError(PoetlabError, ValueError):
    """A model, platform or other name that poetlab does not know."""

    def __init__(self, kind: str, name: str, valid: Iterable[str]):
        self.kind = kind
        self.name = name
        self.valid = tuple(sorted(valid))
        super().__init__(f"unknown {kind} {name!r}; valid {kind}s: {', '.join(self.valid)}")


class InvalidArgumentError(PoetlabError, ValueError):
    """A value outside its domain (a negative budget, a zero batch size, ...)."""


class PlatformSpecError(PoetlabError, ValueError):
    """A platform YAML file that is missing, unreadable or does not follow the schema."""


class GraphFileError(PoetlabError, ValueError):
    """A training-graph JSON file that is missing, unreadable or inconsistent."""


class ScheduleFileError(PoetlabError, ValueError):
    """A schedule JSON file that is missing, unreadable or inconsistent."""


class OutputError(PoetlabError, OSError):
    """An output that could not be written (no space, no permission, a missing directory)."""
