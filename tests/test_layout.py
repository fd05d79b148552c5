"""The house rules of the layout (docs/architecture.md), checked on the source itself: modules use each
other's public names only, the import graph has no cycle, the core depends on nothing but itself, and
``import poetlab`` loads no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import poetlab

PACKAGE = Path(poetlab.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Lines under ``if TYPE_CHECKING:``, which never run and so make no dependency."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports() -> dict[str, list[tuple[str, list[str]]]]:
    """Each module of the package: the poetlab modules it imports (at any depth of the file), with the names."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_lines(tree)
        found = []
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("poetlab"):
                found.append((node.module, [alias.name for alias in node.names]))
            elif isinstance(node, ast.Import):
                found += [(alias.name, []) for alias in node.names if alias.name.startswith("poetlab")]
        modules[_module_name(path)] = found
    return modules


def _resolve(module: str, name: str, known: set[str]) -> str:
    """``from package import submodule`` names the submodule; anything else names the module itself."""
    return f"{module}.{name}" if f"{module}.{name}" in known else module


def test_modules_use_each_others_public_names_only():
    modules = _imports()
    private = [
        f"{importer} imports {name} from {module}"
        for importer, found in modules.items()
        for module, names in found
        for name in names
        if name.startswith("_") and not name.startswith("__") and _resolve(module, name, set(modules)) == module
    ]
    private += [
        f"{importer} imports the private module {module}"
        for importer, found in modules.items()
        for module, _ in found
        if any(part.startswith("_") for part in module.split("."))
    ]
    assert private == [], "\n".join(private)


def test_the_import_graph_has_no_cycle():
    modules = _imports()
    edges = {
        importer: {
            target
            for module, names in found
            for target in ([_resolve(module, n, set(modules)) for n in names] or [module])
            if target in modules and target != importer and not importer.startswith(target + ".")
        }
        for importer, found in modules.items()
    }
    state: dict[str, int] = {}
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert cycles == [], "\n".join(cycles)


def test_the_core_imports_only_the_core_and_the_errors():
    outside = [
        f"{importer} imports {module}"
        for importer, found in _imports().items()
        if importer.startswith("poetlab.core")
        for module, _ in found
        if not (module.startswith("poetlab.core") or module == "poetlab.errors")
    ]
    assert outside == [], "\n".join(outside)


def test_no_module_is_longer_than_600_lines():
    long = [
        f"{p.relative_to(PACKAGE).as_posix()}: {n}"
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 600
    ]
    assert long == [], "\n".join(long)


def test_import_poetlab_loads_no_torch():
    code = "import poetlab, sys; assert 'torch' not in sys.modules, 'import poetlab imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


TESTS = Path(__file__).resolve().parent


def _public_modules() -> list[Path]:
    """Every public module of the package, as a path relative to it: not ``__init__``/``__main__``, and
    neither the module nor a package above it private (leading underscore)."""
    return sorted(
        path.relative_to(PACKAGE)
        for path in PACKAGE.rglob("*.py")
        if not any(part.startswith("_") for part in path.relative_to(PACKAGE).parts)
    )


def test_every_public_module_has_its_test_file():
    """tests/ mirrors src/poetlab (tests/README.md): poetlab/a/b.py is tested in tests/a/test_b.py."""
    missing = [
        f"poetlab/{module.as_posix()} has no tests/{(module.parent / f'test_{module.name}').as_posix()}"
        for module in _public_modules()
        if not (TESTS / module.parent / f"test_{module.name}").is_file()
    ]
    assert missing == [], "\n".join(missing)


def test_test_folders_mirror_the_package():
    """A test folder whose package is gone (renamed, moved) is caught here, not left behind; tests/integration
    holds the tests of the whole pipeline, which test no one module."""
    packages = {path.parent.relative_to(PACKAGE) for path in PACKAGE.rglob("__init__.py")}
    folders = {path.parent.relative_to(TESTS) for path in TESTS.rglob("test_*.py")}
    stray = sorted(f"tests/{folder.as_posix()}" for folder in folders - packages if folder != Path("integration"))
    assert stray == [], "\n".join(stray)
