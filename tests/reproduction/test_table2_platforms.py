"""Table 2 (the platforms): any platforms, the profiled host among them."""

from __future__ import annotations

from poetlab.core.platforms import load_platform
from poetlab.reproduction.table2_platforms import load_table_platforms, platform_table


def test_platform_table_takes_any_platforms():
    table = platform_table([load_platform("jetsontx2"), load_platform("m0")])
    assert table.platform.tolist() == ["jetsontx2", "m0"]
    assert table.set_index("platform").compute_source.to_dict() == {"jetsontx2": "poetlab estimate", "m0": "POET release"}


def test_platform_table_takes_the_profiled_host():
    """The committed host profile joins Table 2 with its sources: measured compute and paging; power
    profiled from RAPL, or marked modeled where RAPL could not be read."""
    platforms = load_table_platforms(["a72", "host"])
    assert [p.name for p in platforms] == ["a72", "host"]
    host = platform_table(platforms).set_index("platform").loc["host"]
    assert host.compute_source == "profiled" and host.paging_source == "profiled"
    assert host.flops_per_s > 0 and host.pageout_throughput_bytes_per_s > 0
    power = platforms[1].sources["compute_power_w"]
    assert power.startswith("modeled") or power.startswith("profiled: RAPL")
