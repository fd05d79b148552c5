"""``poetlab platforms`` and ``poetlab models``: what exists."""

from __future__ import annotations

import argparse

from poetlab.core.paper_models import PAPER_MODELS
from poetlab.core.platforms import HOST, available_platforms, load_platform



def cmd_platforms(args: argparse.Namespace) -> int:
    for name in available_platforms(args.platform_dir):
        platform = load_platform(name, args.platform_dir)
        print(f"{name:<12} {platform.description}")
    print(f"{HOST:<12} this machine, measured by `poetlab profile --platform host` (profiles in data/profiles)")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from poetlab.torch.models import TORCH_MODELS

    for name, spec in PAPER_MODELS.items():
        print(f"{name:<22} paper   {spec.description}")
    for name, torch_spec in TORCH_MODELS.items():
        print(f"{name:<22} traced  {torch_spec.description}")
    return 0
