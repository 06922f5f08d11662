"""The package layering the renovation set up, kept by a test (runtime imports, module level
and inside functions; ``if TYPE_CHECKING:`` blocks are annotations only and not counted)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP = {".venv", "build", "tests", "benchmarks", "scripts", "_scratch", ".git"}

# a package may import only packages before it in this order (and itself)
ORDER = (
    "errors",
    "cache",
    "fpmath",
    "jit",
    "validation",
    "rng",
    "models",
    "traces",
    "scenario",
    "sim",
    "planner",
)
ABOVE_SIM = ("planner", "calibration", "kernels", "cli")


def _modules():
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT)
        if SKIP & set(rel.parts):
            continue
        parts = rel.with_suffix("").parts
        yield rel, list(parts[:-1]), parts


def _runtime_imports(path: Path, pkg: list[str], own: tuple[str, ...]):
    """(target module path, line, at module level) of every relative import outside
    ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(x) for x in ast.walk(node)}
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level and id(node) not in typing_only:
            base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
            target = [*base, *(node.module.split(".") if node.module else [])]
            for alias in node.names:  # ``from pkg import module`` imports the module
                sub = ROOT.joinpath(*target, alias.name)
                is_module = sub.with_suffix(".py").exists() or (sub / "__init__.py").exists()
                yield ([*target, alias.name] if is_module else target), node.lineno, id(node) in top


def _top(parts) -> str:
    name = parts[0] if parts else "__init__"
    return "cli" if name.startswith("cli") else name


def test_no_package_imports_one_above_it():
    bad = []
    for rel, pkg, parts in _modules():
        src = _top(parts)
        if src not in ORDER:
            continue
        for target, line, _ in _runtime_imports(ROOT / rel, pkg, parts):
            dst = _top(target)
            upward = dst in ORDER and ORDER.index(dst) > ORDER.index(src)
            if upward or (src == "sim" and dst in ABOVE_SIM):
                bad.append(f"{rel}:{line} imports {'.'.join(target)}")
    assert not bad, "\n".join(bad)


def test_only_assemble_reads_the_whole_scenario_inside_the_simulation():
    """Stages and policies get resolved parts and their own config sections, never the
    ``Scenario``; in sim/core only ``assemble`` builds from it (the cluster keeps it for the
    results, which report it)."""
    allowed = {Path("sim/core/assemble.py"), Path("sim/core/cluster.py")}
    bad = []
    for rel, _, parts in _modules():
        if parts[:2] not in (("sim", "core"), ("sim", "stages"), ("sim", "policies")):
            continue
        if rel in allowed:
            continue
        tree = ast.parse((ROOT / rel).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any(a.name == "Scenario" for a in node.names):
                bad.append(f"{rel}:{node.lineno}")
    assert not bad, bad


def test_no_import_cycle_between_modules():
    graph: dict[str, set[str]] = {}
    for rel, pkg, parts in _modules():
        mod = ".".join(parts if parts[-1] != "__init__" else parts[:-1]) or "__init__"
        for target, _, at_top in _runtime_imports(ROOT / rel, pkg, parts):
            if at_top:
                graph.setdefault(mod, set()).add(".".join(target) or "__init__")
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for n in graph.get(m, ()):
            if seen.get(n) == 1:
                pytest.fail("import cycle: " + " -> ".join([*path[path.index(n) :], n]))
            if n not in seen:
                visit(n, [*path, n])
        seen[m] = 2

    for m in list(graph):
        if m not in seen:
            visit(m, [m])
