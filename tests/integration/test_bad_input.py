"""Hostile and malformed input (issue 32): each case is refused with one line, exit 1 or 2, no traceback
and no file left behind. The CLI cases run the real command in a subprocess; the API cases call the
public functions."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from poetlab.errors import PoetlabError
from repo_copies import outputs, repo_copy, wait_for
from repo_paths import PLATFORM_DIR, REPO


def assert_one_line_refusal(result, workdir: Path | None = None, before: set[str] | None = None) -> None:
    assert result.returncode in (1, 2), (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    if workdir is not None:
        assert {p.name for p in workdir.iterdir()} == (before or set()), "a file was left behind"


# ---- 1. platform expressions -----------------------------------------------------------------------
def _platform_with(tmp_path: Path, key: str, value: object) -> Path:
    spec = yaml.safe_load((PLATFORM_DIR / "a72.yaml").read_text())
    spec["coefficients"][key]["value"] = value
    path = tmp_path / "a72.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


HOSTILE_EXPRESSIONS = {
    "huge_int_power": ("flops_per_s", "2 ** 10000"),
    "float_overflow": ("flops_per_s", "10.0 ** 400"),
    "many_terms": ("flops_per_s", " + ".join(["1"] * 200_000)),
    "subnormal": ("pagein_latency_s", "1e-320"),
    "tower": ("flops_per_s", "9 ** 9 ** 9"),
    "deep_unary": ("flops_per_s", "- " * 100 + "1e9"),
    "huge_literal": ("ram_bytes", "1" + "0" * 300),
    "negative_fractional_power": ("flops_per_s", "(-8) ** 0.5"),
    "zero_negative_power": ("flops_per_s", "0 ** -1"),
    "out_of_range_latency": ("pagein_latency_s", "10 ** 6"),
    "nan": ("flops_per_s", float("nan")),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_EXPRESSIONS))
def test_hostile_platform_expression_cli(case, tmp_path, run_cli):
    key, value = HOSTILE_EXPRESSIONS[case]
    path = _platform_with(tmp_path, key, value)
    before = {p.name for p in tmp_path.iterdir()}
    result = run_cli("graph", "--model", "resnet18", "--platform", str(path), cwd=tmp_path)
    assert_one_line_refusal(result, tmp_path, before)
    assert str(path) in result.stderr and f"coefficients.{key}" in result.stderr


@pytest.mark.parametrize("case", sorted(HOSTILE_EXPRESSIONS))
def test_hostile_platform_expression_api(case, tmp_path):
    from poetlab.core.platforms import load_platform_file

    key, value = HOSTILE_EXPRESSIONS[case]
    with pytest.raises(PoetlabError) as info:
        load_platform_file(_platform_with(tmp_path, key, value))
    assert "\n" not in str(info.value)


def test_release_expressions_still_exact():
    from poetlab.core.platforms import evaluate_number

    assert evaluate_number("(16283 * 100 * 1000) / (13.53) * (2.035 / 1.5) / ((995 - 229) * (10 ** (-3)))") == (
        (16283 * 100 * 1000) / (13.53) * (2.035 / 1.5) / ((995 - 229) * (10 ** (-3)))
    )
    assert evaluate_number("8 * 1024 ** 3") == float(8 * 1024**3)
    assert math.isfinite(evaluate_number("2 ** 64"))


# ---- 2. numbers validated where read ---------------------------------------------------------------
PROFILE = REPO / "data" / "profiles" / "host-resnet18_cifar_torch.json"


def _profile_with(tmp_path: Path, mutate) -> Path:
    import json

    data = json.loads(PROFILE.read_text())
    mutate(data)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))  # NaN and Infinity as Python's json writes them
    return path


def _set_node(key, value):
    def mutate(data):
        data["model"]["nodes"][3][key] = value

    return mutate


def _set_disk(key, value):
    def mutate(data):
        data["disk"][key] = value

    return mutate


BAD_PROFILES = {
    "nan_latency": _set_disk("pagein_latency_s", float("nan")),
    "negative_latency": _set_disk("pageout_latency_s", -0.5),
    "infinite_node_runtime": _set_node("runtime_s", float("inf")),
    "nan_node_energy": _set_node("energy_j", float("nan")),
    "negative_step": lambda data: data["model"].__setitem__("step_runtime_s", -1.0),
    "string_throughput": _set_disk("pagein_throughput_bytes_per_s", "fast"),
    "deeply_nested": lambda data: data.__setitem__("notes", None),  # replaced below
}


@pytest.mark.parametrize("case", sorted(BAD_PROFILES))
def test_bad_profile_cli(case, tmp_path, run_cli):
    path = _profile_with(tmp_path, BAD_PROFILES[case])
    if case == "deeply_nested":
        path.write_text('{"format": "poetlab.HostProfile", "notes": ' + "[" * 100_000 + "]" * 100_000 + "}")
    before = {p.name for p in tmp_path.iterdir()}
    result = run_cli(
        "solve", "--model", "resnet18_cifar_torch", "--platform", "host", "--profile", str(path), "--ram-budget", "1e9", cwd=tmp_path
    )
    assert_one_line_refusal(result, tmp_path, before)
    assert str(path) in result.stderr


def _graph_file(tmp_path: Path, mutate) -> Path:
    import json

    from poetlab.core.paper_models import build_paper_graph

    data = build_paper_graph("linear").to_dict()
    mutate(data)
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(data))
    return path


def _graph_node(key, value):
    def mutate(data):
        data["nodes"][2][key] = value

    return mutate


BAD_GRAPHS = {
    "nan_flops": _graph_node("flop", float("nan")),
    "inf_flops": _graph_node("flop", float("inf")),
    "fractional_bytes": _graph_node("output_bytes", 10.5),
    "negative_shape": _graph_node("output_shape", [-1, 784]),
    "string_inputs": _graph_node("inputs", "01"),
    "bool_bytes": _graph_node("output_bytes", True),
    "nodes_not_list": lambda data: data.__setitem__("nodes", {"a": 1}),
}


@pytest.mark.parametrize("case", sorted(BAD_GRAPHS))
def test_bad_graph_file(case, tmp_path):
    from poetlab.core.graph import TrainingGraph

    with pytest.raises(PoetlabError) as info:
        TrainingGraph.load(_graph_file(tmp_path, BAD_GRAPHS[case]))
    assert "\n" not in str(info.value) and "graph.json" in str(info.value)


def test_deeply_nested_graph_file(tmp_path):
    from poetlab.core.graph import TrainingGraph

    path = tmp_path / "graph.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(PoetlabError, match="nested too deeply"):
        TrainingGraph.load(path)


BAD_FLAGS = {
    "ram_budget_huge": ("solve", "--model", "linear", "--platform", "a72", "--ram-budget", "1e300"),
    "ram_budget_nan": ("solve", "--model", "linear", "--platform", "a72", "--ram-budget", "nan"),
    "batch_1e14": ("graph", "--model", "resnet18", "--platform", "a72", "--batch-size", "100000000000000"),
    "batch_1e16": ("graph", "--model", "resnet18", "--platform", "a72", "--batch-size", "10000000000000000"),
    "batch_1e9_torch": ("graph", "--model", "resnet18_cifar_torch", "--platform", "a72", "--batch-size", "1000000000"),
    "batch_float": ("graph", "--model", "resnet18", "--platform", "a72", "--batch-size", "1e14"),
    "threads_too_many": ("solve", "--model", "linear", "--platform", "a72", "--ram-budget", "1e6", "--threads", "100000"),
    "relu_bias_nan": ("technique", "bittrain", "--relu-bias", "nan"),
    "runtime_budget_inf": ("solve", "--model", "linear", "--platform", "a72", "--ram-budget", "1e6", "--runtime-budget", "inf"),
    "mip_gap_nan": ("solve", "--model", "linear", "--platform", "a72", "--ram-budget", "1e6", "--mip-gap", "nan"),
}


@pytest.mark.parametrize("case", sorted(BAD_FLAGS))
def test_bad_flag(case, tmp_path, run_cli):
    args = BAD_FLAGS[case]
    if "--platform" in args:
        args = (*args, "--platform-dir", str(PLATFORM_DIR))
    result = run_cli(*args, cwd=tmp_path)
    assert_one_line_refusal(result, tmp_path, set())
    assert result.returncode == 2
    flag = next(a for a in args if a.startswith("--") and a not in ("--model", "--platform", "--platform-dir", "--ram-budget")) if case != "ram_budget_huge" and case != "ram_budget_nan" else "--ram-budget"
    assert f"argument {flag}" in result.stderr, result.stderr


def test_torch_batch_beyond_memory_is_refused_before_tracing(tmp_path, run_cli):
    result = run_cli("graph", "--model", "resnet18_cifar_torch", "--platform", "a72", "--platform-dir", str(PLATFORM_DIR), "--batch-size", "65536", cwd=tmp_path)
    assert_one_line_refusal(result, tmp_path, set())
    assert "use a batch size of at most" in result.stderr


def test_ram_budget_flag_names_the_range(run_cli, tmp_path):
    result = run_cli("solve", "--model", "linear", "--platform", "a72", "--ram-budget", "1e300", cwd=tmp_path)
    assert "--ram-budget" in result.stderr and "1125899906842624" in result.stderr


def _api_cases():
    from poetlab.core.costs import CostModel
    from poetlab.core.paper_models import build_paper_graph
    from poetlab.core.platforms import load_platform
    from poetlab.core.schedule import simulate

    graph = build_paper_graph("linear")
    other = build_paper_graph("resnet18_cifar")
    platform = load_platform("a72")
    costs = CostModel.from_flops(graph, platform)
    return graph, other, platform, costs, simulate


def _plain_schedule(graph):
    from poetlab.core.schedule import checkpoint_all_schedule

    return checkpoint_all_schedule(graph)


API_CASES = {
    "simulate_nan_budget": lambda g, o, p, c, sim: sim(_plain_schedule(g), g, c, ram_budget_bytes=float("nan")),
    "simulate_string_budget": lambda g, o, p, c, sim: sim(_plain_schedule(g), g, c, ram_budget_bytes="1e9"),
    "simulate_graph_none": lambda g, o, p, c, sim: sim(_plain_schedule(g), None, c),
    "simulate_costs_of_other_graph": lambda g, o, p, c, sim: sim(_plain_schedule(g), o, c),
    "from_flops_graph_none": lambda g, o, p, c, sim: type(c).from_flops(None, p),
    "from_flops_platform_name": lambda g, o, p, c, sim: type(c).from_flops(g, "a72"),
    "from_profile_graph_none": lambda g, o, p, c, sim: type(c).from_profile(None, p),
    "costs_strings": lambda g, o, p, c, sim: type(c)("a72", *(["x"] * 6)),
    "solve_string_runtime_factor": lambda g, o, p, c, sim: _solve(g, c, 1e9, "2"),
    "solve_graph_none": lambda g, o, p, c, sim: _solve(None, c, 1e9),
    "solve_costs_of_other_graph": lambda g, o, p, c, sim: _solve(o, c, 1e9),
}


def _solve(*args):
    from poetlab import solve

    return solve(*args)


@pytest.mark.parametrize("case", sorted(API_CASES))
def test_bad_api_call(case):
    from poetlab.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError) as info:
        API_CASES[case](*_api_cases())
    assert "\n" not in str(info.value)


# ---- 3. outputs ------------------------------------------------------------------------------------
GRAPH_ARGS = ("graph", "--model", "linear", "--platform", "a72", "--platform-dir", str(PLATFORM_DIR), "--output")


def test_output_mode_follows_umask(tmp_path, run_cli):
    import os
    import stat

    previous = os.umask(0o022)
    try:
        result = run_cli(*GRAPH_ARGS, str(tmp_path / "g.json"), cwd=tmp_path)
    finally:
        os.umask(previous)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE((tmp_path / "g.json").stat().st_mode) == 0o644


def test_output_written_through_a_symlink(tmp_path, run_cli):
    target = tmp_path / "real.json"
    target.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    result = run_cli(*GRAPH_ARGS, str(link), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and '"poetlab.TrainingGraph"' in target.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


@pytest.mark.parametrize("where", ["device", "directory"])
def test_output_device_or_directory_refused(where, tmp_path, run_cli):
    import stat

    (tmp_path / "adir").mkdir()
    output = "/dev/full" if where == "device" else str(tmp_path / "adir")
    before = {p.name for p in tmp_path.iterdir()}
    result = run_cli(*GRAPH_ARGS, output, cwd=tmp_path)
    assert_one_line_refusal(result, tmp_path, before)
    assert list((tmp_path / "adir").iterdir()) == []
    assert stat.S_ISCHR(Path("/dev/full").stat().st_mode)


@pytest.mark.parametrize(
    "args", [("models",), ("solve", "--model", "linear", "--platform", "a72", "--platform-dir", str(PLATFORM_DIR), "--ram-budget", "1e6", "--json")], ids=["models", "solve_json"]
)
def test_full_stdout_ends_quietly(args, tmp_path):
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "poetlab", *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_closed_stdout_ends_quietly(tmp_path):
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "poetlab", "models"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # like `| head -0`: the reader is gone before anything is written
    stderr = process.stderr.read()
    assert process.wait(timeout=300) == 1
    assert stderr == "", stderr


def test_stdout_closed_from_the_start_is_one_line():
    import subprocess
    import sys

    # (`poetlab models >&-`: Python starts with sys.stdout None)
    result = subprocess.run(["sh", "-c", 'exec "$0" -m poetlab models >&-', sys.executable], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip() == "poetlab: error: cannot write the output: standard output is closed", result.stderr


# ---- 4. a schedule file records its graph ----------------------------------------------------------
def _two_graphs_of_one_size():
    from poetlab.core.graph import Node, TrainingGraph

    def chain(size: int) -> TrainingGraph:
        nodes = [Node(f"n{i}", "op", (i - 1,) if i else (), (size,), size, 1.0) for i in range(4)]
        return TrainingGraph("chain", tuple(nodes))

    return chain(100), chain(200)


def test_schedule_replayed_on_another_graph_is_refused(tmp_path, run_cli):
    from poetlab.core.costs import CostModel
    from poetlab.core.platforms import load_platform
    from poetlab.core.schedule import Schedule, checkpoint_all_schedule, simulate

    graph, other = _two_graphs_of_one_size()
    path = tmp_path / "plan.json"
    checkpoint_all_schedule(graph).save(path, graph)
    assert Schedule.load(path, graph).graph_fingerprint == graph.fingerprint
    with pytest.raises(PoetlabError) as info:
        Schedule.load(path, other)
    assert "another graph" in str(info.value) and "\n" not in str(info.value)
    costs = CostModel.from_flops(other, load_platform("a72", PLATFORM_DIR))
    with pytest.raises(PoetlabError, match="another graph"):
        simulate(Schedule.load(path), other, costs)


def test_schedule_file_without_fingerprint_still_loads(tmp_path):
    from poetlab.core.schedule import Schedule, checkpoint_all_schedule

    graph, other = _two_graphs_of_one_size()
    path = tmp_path / "old.json"
    checkpoint_all_schedule(graph).save(path)
    assert '"graph"' not in path.read_text()
    assert Schedule.load(path, other).graph_fingerprint is None


def test_schedule_file_with_bad_fingerprint(tmp_path):
    from poetlab.core.schedule import Schedule

    path = tmp_path / "bad.json"
    path.write_text('{"format": "poetlab.Schedule", "version": 1, "graph": ["x"], "n_nodes": 1, "ops": [["compute", 0, 0]]}')
    with pytest.raises(PoetlabError, match="fingerprint"):
        Schedule.load(path)


# ---- 5. the pipeline's parameters ------------------------------------------------------------------


def _params_file(tmp_path: Path, preset: str, **changes) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    presets = params["presets"]
    presets[preset] = presets.pop("smoke")
    for stage, values in changes.items():
        presets[preset][stage].update(values)
    params["preset"] = preset
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def _check(stage: str, tmp_path: Path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, POETLAB_PLATFORM_DIR=str(PLATFORM_DIR))
    return subprocess.run(
        [sys.executable, "-m", "poetlab.reproduction", "check", stage], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300
    )


PIPELINE_CASES = {
    "preset_shell": ("graphs", "smoke$(touch pwned)", {}),
    "preset_quote": ("baselines", "smoke';touch pwned;'", {}),
    "graphs_bad_platform": ("graphs", "smoke", {"graphs": {"platforms": ["m0", "nosuch"]}}),
    "graphs_huge_batch": ("graphs", "smoke", {"graphs": {"batch_size": 10**9}}),
    "baselines_bad_method": ("baselines", "smoke", {"baselines": {"methods": ["poet", "nosuch"]}}),
    "baselines_time_limit_inf": ("baselines", "smoke", {"baselines": {"time_limit_s": float("inf")}}),
    "fig3_time_limit_inf": ("fig3_frontier", "smoke", {"fig3_frontier": {"time_limit_s": float("inf")}}),
}


@pytest.mark.parametrize("case", sorted(PIPELINE_CASES))
def test_pipeline_check_refuses(case, tmp_path):
    stage, preset, changes = PIPELINE_CASES[case]
    _params_file(tmp_path, preset, **changes)
    result = _check(stage, tmp_path)
    assert_one_line_refusal(result, tmp_path, {"params.yaml"})
    assert result.returncode == 2


def test_pipeline_check_passes_the_committed_params(tmp_path):
    for stage in ("graphs", "baselines", "fig3_frontier"):
        _params_file(tmp_path, "smoke")
        result = _check(stage, tmp_path)
        assert result.returncode == 0, result.stderr


def test_dvc_commands_paste_no_parameter_and_check_first():
    import re

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        cmd = stage["cmd"]
        assert "${" not in cmd, f"{name}: a parameter pasted into the shell command {cmd!r}"  # (the notebooks read the preset)
        if "papermill" in cmd:
            assert re.match(rf"python -m poetlab\.reproduction check {name} &&", cmd), f"{name}: no parameter check first"
            assert "experiments/params_checked.txt" in stage["deps"], f"{name}: runs before the params_check stage"
            assert f'python -m poetlab.reproduction run {name} --parent "$PPID" -- papermill ' in cmd, f"{name}: papermill would outlive dvc"
            assert cmd.endswith(f"|| python -m poetlab.reproduction failed {name}"), f"{name}: a failure does not say how to restore the outputs"
    check = stages["params_check"]
    assert check["params"] == ["preset", "presets.${preset}"] and check["outs"] == [{"experiments/params_checked.txt": {"cache": False, "persist": True}}]


# ---- 6. signals: the HiGHS worker dies with its parent, page files go with an execute -------------
def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if int(ppid) == pid and state != "Z":
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _start_cli(*args: str, cwd: Path):
    """The CLI as a terminal starts it: SIGINT at its default. A shell without job control starts a
    background job (``make test &``, a CI runner) with SIGINT ignored, every process below inherits that,
    and Python then leaves it ignored, as it should: Ctrl-C is not meant for background jobs."""
    import signal
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "poetlab", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


# a MILP that runs for minutes: a tight budget and no gap tolerance (stopped long before its limit); paging only, so
# the phases before the MILP are quick and its HiGHS worker starts about a second after the CLI
LONG_SOLVE = ("solve", "--model", "resnet18_cifar", "--platform", "a72", "--platform-dir", str(PLATFORM_DIR), "--ram-budget", "400000",
              "--no-remat", "--solver", "highs", "--mip-gap", "0", "--time-limit", "300")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_signal_to_solve_leaves_no_worker(how, tmp_path):
    import signal

    process = _start_cli(*LONG_SOLVE, cwd=tmp_path)
    try:
        workers = wait_for(lambda: _children(process.pid), 120, "the HiGHS worker to start")
        process.send_signal(getattr(signal, how))
        _, stderr = process.communicate(timeout=30)
        wait_for(lambda: not any(_alive(w) for w in workers), 10, "the worker to die with its parent")  # SIGKILL: the worker's own watch
    finally:
        if process.poll() is None:
            process.kill()
    if how != "SIGKILL":
        assert process.returncode == {"SIGTERM": 143, "SIGINT": 130}[how], stderr
        assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert list(tmp_path.iterdir()) == []


def _page_files(pages: Path) -> list[Path]:
    """The page files under ``pages``; none while a run's paging folder is being removed as it is listed
    (each run of ``compare_training`` makes and removes its own)."""
    try:
        return list(pages.glob("poetlab-pages-*/*.bin"))
    except FileNotFoundError:
        return []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT"])
def test_signal_to_execute_removes_page_files(how, tmp_path):
    import signal

    pages = tmp_path / "pages"
    pages.mkdir()
    # bert_small_torch at batch 2 and 960,000 bytes (its smallest footprint is 935,424 plus 20,232 kept free;
    # checkpoint-all needs 951,808) pages a tensor out every step; 100,000 steps run for minutes
    process = _start_cli("execute", "--model", "bert_small_torch", "--batch-size", "2", "--platform", "a72", "--platform-dir", str(PLATFORM_DIR), "--ram-budget", "960000",
                         "--steps", "100000", "--time-limit", "30", "--paging-dir", str(pages), cwd=tmp_path)
    try:
        wait_for(lambda: _page_files(pages), 240, "a page file")
        process.send_signal(getattr(signal, how))
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == {"SIGTERM": 143, "SIGINT": 130}[how], stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert list(pages.iterdir()) == [], "the paging directory was left behind"


# ---- 7. `dvc repro` with a wrong parameter stops before DVC removes any output --------------------
def _wrong_platform(section: dict) -> None:
    if "platforms" in section:
        section["platforms"] = [*section["platforms"][:1], "nosuch"]
    elif "platform" in section:
        section["platform"] = "nosuch"
    else:
        section["cases"] = [[section["cases"][0][0], "nosuch"]]


PLATFORM_STAGES = ("graphs", "baselines", "table2_platforms", "fig3_frontier", "fig4_runtime", "fig5_capuchin", "table3_pofo", "feasibility", "techniques_frontier", "user_models")


def _repo_copy_with_wrong_platform(tmp_path: Path, stage: str) -> tuple[Path, dict[str, str]]:
    """:func:`repo_copies.repo_copy` with an unknown platform in ``stage``'s smoke section."""
    return repo_copy(tmp_path, lambda smoke: _wrong_platform(smoke[stage]))


@pytest.mark.parametrize("stage", [stage if stage == "fig3_frontier" else pytest.param(stage, marks=pytest.mark.slow) for stage in PLATFORM_STAGES])
def test_dvc_repro_with_a_wrong_platform_deletes_no_output(stage, tmp_path):
    """Real `dvc repro`, the smoke preset with an unknown platform in one stage: the params_check stage stops
    it before DVC removes any stage's outputs, so every committed output is still there, byte for byte."""
    import subprocess
    import sys

    copy, env = _repo_copy_with_wrong_platform(tmp_path, stage)
    before = outputs(copy)
    result = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=copy, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode != 0, result.stdout
    assert f"presets.smoke.{stage}." in result.stderr and "unknown platform 'nosuch'" in result.stderr, result.stderr
    assert "Running stage 'params_check'" in result.stdout and "Running stage" not in result.stdout.replace("Running stage 'params_check'", ""), result.stdout
    assert outputs(copy) == before, "an output was removed or changed"


def test_a_failed_stage_says_how_to_restore_and_the_line_works(tmp_path):
    """`dvc repro -s graphs` skips the params_check stage, so DVC removes the stage's outputs before its own
    check fails: the stage ends with the restore line, and `git checkout experiments` does restore them."""
    import subprocess
    import sys

    copy, env = _repo_copy_with_wrong_platform(tmp_path, "graphs")
    before = outputs(copy)
    result = subprocess.run([sys.executable, "-m", "dvc", "repro", "-s", "graphs"], cwd=copy, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode != 0
    assert "dvc repro: stage graphs failed; `git checkout experiments` restores the committed outputs" in result.stderr, result.stderr
    assert outputs(copy) != before  # DVC removed them (what the params_check stage prevents in a plain `dvc repro`)
    subprocess.run(["git", "checkout", "experiments"], cwd=copy, check=True, capture_output=True, timeout=60)
    assert outputs(copy) == before


# ---- 8. graph and schedule files of more nodes than the cap ---------------------------------------
def _huge_schedule(tmp_path: Path, n_nodes: int, stage: int = 0) -> Path:
    path = tmp_path / "huge.json"
    path.write_text(f'{{"format": "poetlab.Schedule", "version": 1, "n_nodes": {n_nodes}, "ops": [["compute", 0, {stage}]]}}')
    return path


def _huge_graph(tmp_path: Path, n_nodes: int) -> Path:
    import json

    node = {"name": "n", "kind": "op", "inputs": [], "output_shape": [1], "output_bytes": 4, "flop": 1.0}
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({"format": "poetlab.TrainingGraph", "version": 1, "name": "huge", "nodes": [node] * n_nodes}))
    return path


OVERSIZED = {
    "schedule_1e6_nodes": lambda tmp: ("schedule", _huge_schedule(tmp, 10**6)),
    "schedule_1e18_nodes": lambda tmp: ("schedule", _huge_schedule(tmp, 10**18)),
    "schedule_huge_stage": lambda tmp: ("schedule", _huge_schedule(tmp, 4, stage=10**9)),
    "graph_20k_nodes": lambda tmp: ("graph", _huge_graph(tmp, 20_000)),
}


@pytest.mark.parametrize("case", sorted(OVERSIZED))
def test_file_over_the_node_cap_is_refused_before_allocating(case, tmp_path):
    import resource

    from poetlab.core.graph import MAX_FILE_NODES, TrainingGraph
    from poetlab.core.schedule import Schedule

    kind, path = OVERSIZED[case](tmp_path)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(PoetlabError) as info:
        (Schedule.load if kind == "schedule" else TrainingGraph.load)(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and f"{MAX_FILE_NODES:,}" in message and "MAX_FILE_NODES" in message
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: nothing the size of the file's claim
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.json"]


def test_files_at_the_node_cap_still_load(tmp_path):
    from poetlab.core.graph import MAX_FILE_NODES
    from poetlab.core.schedule import Schedule

    assert Schedule.load(_huge_schedule(tmp_path, MAX_FILE_NODES, stage=MAX_FILE_NODES - 1)).n_nodes == MAX_FILE_NODES


# ---- 9. every kept schedule records its graph -----------------------------------------------------
KEPT = sorted((REPO / "data" / "schedules").glob("*.json"))


def test_every_tracked_schedule_records_its_graph():
    from poetlab.core.schedule import Schedule

    assert KEPT
    for path in KEPT:
        assert Schedule.load(path).graph_fingerprint is not None, f"{path.name}: no graph fingerprint, so loading it checks no graph"


@pytest.mark.slow
@pytest.mark.parametrize("path", KEPT, ids=[p.stem for p in KEPT])
def test_tracked_schedule_fingerprint_is_its_traced_graph(path):
    """As bench_execute.py traces its cases (fused, the file's batch size): the fingerprint is that graph's."""
    import re

    from poetlab.core.schedule import Schedule
    from poetlab.torch.models import build_torch_model
    from poetlab.torch.trace import trace

    name, batch = re.fullmatch(r"(.+)-x(\d+)-[0-9.]+-\w+", path.stem).groups()
    model = build_torch_model(name, int(batch))
    graph = trace(model.module, model.inputs, model.loss_fn, model.targets, fuse=True, name=name)
    assert Schedule.load(path, graph).graph_fingerprint == graph.fingerprint


def test_kept_plan_without_fingerprint_gets_it_once_it_replays(tmp_path):
    import dataclasses

    from poetlab.core.costs import CostModel
    from poetlab.core.paper_models import build_paper_graph
    from poetlab.core.platforms import load_platform
    from poetlab.core.schedule import Schedule, checkpoint_all_schedule, simulate
    from poetlab.planners.kept_plans import planned_schedule

    graph = build_paper_graph("linear")
    costs = CostModel.from_flops(graph, load_platform("a72", PLATFORM_DIR))
    budget = 0.7 * simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    planned, status, _ = planned_schedule(graph, costs, budget, "plan", "poet", 10.0, tmp_path)
    assert planned is not None and status != "loaded"
    path = tmp_path / "plan.json"
    dataclasses.replace(Schedule.load(path), graph_fingerprint=None).save(path)  # as files were kept before
    assert '"graph"' not in path.read_text()
    schedule, status, message = planned_schedule(graph, costs, budget, "plan", "poet", 10.0, tmp_path)
    assert status == "loaded" and "fingerprint recorded" in message and schedule.ops == planned.ops
    assert Schedule.load(path).graph_fingerprint == graph.fingerprint
    with pytest.raises(PoetlabError, match="another graph"):
        Schedule.load(path, build_paper_graph("resnet18_cifar"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_worker_dies_with_a_killed_parent_even_when_idle(tmp_path):
    """The worker's own guard, alone: its stdin stays open (this test holds the pipe) and its messages go to
    /dev/null, so neither end of file nor a broken pipe would end it; its parent killed outright must."""
    import os
    import signal
    import subprocess
    import sys

    from poetlab.planners.poet import backends

    read_end, write_end = os.pipe()
    parent_code = (
        "import os, subprocess, sys, time\n"
        f"worker = subprocess.Popen([sys.executable, '-I', {str(backends.WORKER_PATH)!r}, str(os.getpid())], stdin={read_end}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(worker.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True, pass_fds=(read_end,), cwd=tmp_path)
    os.close(read_end)
    worker = 0
    try:
        worker = int(parent.stdout.readline())
        wait_for(lambda: Path(f"/proc/{worker}/cmdline").exists() and b"_highs_worker" in Path(f"/proc/{worker}/cmdline").read_bytes(), 60, "the worker")
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        wait_for(lambda: not _alive(worker), 10, "the idle worker to die with its parent")
    finally:
        os.close(write_end)
        if parent.poll() is None:
            parent.kill()
        if worker and _alive(worker):
            os.kill(worker, signal.SIGKILL)
