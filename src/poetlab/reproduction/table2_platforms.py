"""The paper's Table 2: the platforms, their cost coefficients and where each comes from.

Takes any list of platforms (the five of the release, and the profiled ``host`` once it exists)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from poetlab.core.platforms import HOST, Platform, load_platform

#: The device the paper's Table 2 names for each platform of the release.
PAPER_NAMES = {
    "m0": "MKR1000 (Cortex-M0+)",
    "m4": "nRF52840 (Cortex-M4F)",
    "a72": "Raspberry Pi 4B (Cortex-A72)",
    "a72nocache": "Raspberry Pi 4B (Cortex-A72), no write cache",
    "jetsontx2": "Jetson TX2 (Cortex-A57 CPU)",
    HOST: "this machine (profiled)",
}


def load_table_platforms(names: Sequence[str]) -> list[Platform]:
    """The platforms named, each from its YAML file, and ``host`` from its committed profile (the one of
    ``resnet18_cifar_torch`` if present, else any host profile in ``data/profiles``)."""
    from poetlab.torch.host_profile import HostProfile, find_host_profile

    return [
        HostProfile.load(find_host_profile("resnet18_cifar_torch")).platform() if name == HOST else load_platform(name)
        for name in names
    ]


def _origin(source: str) -> str:
    if source.startswith("modeled"):
        return "modeled"
    if source.startswith("POET release"):
        return "POET release"
    if "estimate" in source:
        return "poetlab estimate"
    if "profile" in source.lower():
        return "profiled"
    return source.split(",")[0].split("(")[0].strip()


def platform_table(platforms: Sequence[Platform]) -> pd.DataFrame:
    """One row per platform: its coefficients in SI units and, for each group, the source."""
    rows = []
    for p in platforms:
        rows.append({
            "platform": p.name,
            "device": PAPER_NAMES.get(p.name, p.description),
            "ram_bytes": None if p.ram_bytes is None else int(p.ram_bytes),
            "flops_per_s": p.flops_per_s,
            "flop_per_j": p.flop_per_j,
            "compute_power_w": p.compute_power_w,
            "memory_power_w": p.memory_power_w,
            "pagein_latency_s": p.pagein_latency_s,
            "pagein_throughput_bytes_per_s": p.pagein_throughput_bytes_per_s,
            "pageout_latency_s": p.pageout_latency_s,
            "pageout_throughput_bytes_per_s": p.pageout_throughput_bytes_per_s,
            "compute_source": _origin(p.sources.get("flops_per_s", "")),
            "paging_source": _origin(p.sources.get("pageout_throughput_bytes_per_s", "")),
            "ram_source": _origin(p.sources.get("ram_bytes", "unknown")),
        })
    return pd.DataFrame(rows)


def platform_sources(platforms: Sequence[Platform]) -> pd.DataFrame:
    """The full source text of every coefficient: one row per (platform, coefficient)."""
    return pd.DataFrame(
        [{"platform": p.name, "coefficient": key, "source": text} for p in platforms for key, text in p.sources.items()]
    )


def platform_metrics(table: pd.DataFrame) -> dict[str, object]:
    return {
        "n_platforms": int(len(table)),
        "estimated": sorted(table.platform[table.compute_source != "POET release"]),
    }
