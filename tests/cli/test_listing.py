"""The `poetlab platforms` and `poetlab models` commands, run for real in a subprocess."""

from __future__ import annotations


def test_listing_commands(run_cli):
    platforms = run_cli("platforms")
    assert platforms.returncode == 0 and len(platforms.stdout.splitlines()) == 6
    assert platforms.stdout.splitlines()[-1].startswith("host ")
    models = run_cli("models")
    assert models.returncode == 0 and "resnet18_cifar" in models.stdout
