"""Where the tests find the checkout and its built-in platforms, wherever under tests/ they live."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLATFORM_DIR = REPO / "src" / "poetlab" / "core" / "platform_specs"  # the built-in platforms
PARAMS = REPO / "params.yaml"
