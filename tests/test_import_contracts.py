"""The two pure cores, the engine (inference/engine/) and the town's rules (town/rules/), import
nothing of the Django side, and nothing of the product imports the benchmarks beside it
(benchmarks/ imports the engine, never the reverse): the import-linter contracts in
pyproject.toml, checked here, and a plain walk over their files for what the contracts cannot
see (an import inside a function is seen by both; an import of a sibling package added later is
caught by the walk).

The town asks inference through its door (inference/services.py): it never imports the services
behind it (inference/completions/services.py, inference/fleet/services.py), the fleet's routing
internals (the router, the prompt prefix keys) nor the engine, and it never rewrites
Django settings at run time (an engine for a block of work goes through inference too)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import inference
import inference.engine
import town
import town.rules

ROOT = Path(__file__).resolve().parent.parent
DJANGO_SIDE = {"django", "celery", "channels", "rest_framework", "drf_spectacular", "pokosite"}


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


def offenders(package_dir: Path, allowed_own: str, forbidden_roots: set[str]) -> dict:
    """Files importing a forbidden root, or a module of their own root package outside
    `allowed_own` (e.g. town.rules may import town.rules.*, nothing else of town)."""
    own_root = allowed_own.split(".")[0]
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        bad = sorted(
            m
            for m in imported_modules(path)
            if m.split(".")[0] in forbidden_roots
            or (
                m.split(".")[0] == own_root
                and m != allowed_own
                and not m.startswith(allowed_own + ".")
            )
        )
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_the_import_linter_contracts_hold():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_engine_imports_only_itself_and_libraries():
    engine_dir = Path(inference.engine.__file__).parent
    assert offenders(engine_dir, "inference.engine", DJANGO_SIDE | {"town"}) == {}


def test_the_town_rules_import_only_themselves_and_the_standard_library():
    rules_dir = Path(town.rules.__file__).parent
    assert offenders(rules_dir, "town.rules", DJANGO_SIDE | {"inference"}) == {}


def test_nothing_of_the_product_imports_the_benchmarks():
    for package in ("inference", "town", "pokosite"):
        assert offenders(ROOT / package, package, {"benchmarks"}) == {}, package


def test_the_engine_never_reads_the_environment():
    engine_dir = Path(inference.engine.__file__).parent
    readers = [p.name for p in engine_dir.rglob("*.py") if "os.environ" in p.read_text()]
    assert readers == []


# The engine's floors (the import-linter contract "Nothing below the engine's core imports it"
# says the same): these read each other, never core/.
BELOW_CORE = [
    "config.py", "request.py", "sampling_params.py", "scheduler_output.py", "metrics.py",
    "request_errors.py", "outputs.py", "kv", "runner", "attention", "kernels", "models",
    "distributed", "spec_decode", "structured_output", "loading", "memory_plan",
]  # fmt: skip


def absolute_imports(path: Path, package: str) -> set[str]:
    """Every module `path` names in an import, relative ones resolved against `package` (the
    file's own package), and `from a import b` read as both `a` and `a.b`."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            parent = ".".join(base) if node.level else ""
            module = ".".join(p for p in (parent, node.module or "") if p)
            modules.add(module)
            modules.update(f"{module}.{alias.name}" for alias in node.names)
    return modules


def core_importers(engine_dir: Path, below_core: list[str]) -> dict:
    found = {}
    for entry in below_core:
        root = engine_dir / entry
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            name = path.relative_to(engine_dir.parent.parent)
            package = ".".join(name.parts[:-1])  # a.py's and __init__.py's own package
            bad = sorted(
                m
                for m in absolute_imports(path, package)
                if m == "inference.engine.core" or m.startswith("inference.engine.core.")
            )
            if bad:
                found[str(name)] = bad
    return found


def test_nothing_below_the_engine_core_imports_it():
    engine_dir = Path(inference.engine.__file__).parent
    assert all((engine_dir / entry).exists() for entry in BELOW_CORE)
    assert core_importers(engine_dir, BELOW_CORE) == {}


def test_the_core_walk_sees_relative_and_absolute_imports(tmp_path):
    engine_dir = tmp_path / "inference" / "engine"
    (engine_dir / "kv" / "tiers").mkdir(parents=True)
    (engine_dir / "kv" / "tiers" / "a.py").write_text("from ...core import scheduler\n")
    (engine_dir / "kv" / "b.py").write_text("from ..core.request import Request\n")
    (engine_dir / "kv" / "c.py").write_text("from inference.engine import core\n")
    (engine_dir / "kv" / "d.py").write_text("import inference.engine.core.llm_engine\n")
    (engine_dir / "kv" / "e.py").write_text("from ..request import Request\n")
    (engine_dir / "request.py").write_text("from .core.scheduler import Scheduler\n")
    found = core_importers(engine_dir, ["kv", "request.py"])
    found = {Path(path).name: modules for path, modules in found.items()}
    assert set(found) == {"a.py", "b.py", "c.py", "d.py", "request.py"}


# What the town must not import: the services behind its door (inference/services.py), routing's
# internals, the engine and the engine's slot in this process; each name also forbids the modules
# under it.
TOWN_FORBIDDEN = (
    "inference.fleet.router",
    "inference.fleet.prefixes",
    "inference.fleet.services",
    "inference.completions.services",
    "inference.completions.runtime",
    "inference.engine",
)


def town_importers(town_dir: Path, forbidden: tuple[str, ...]) -> dict:
    found = {}
    for path in sorted(town_dir.rglob("*.py")):
        name = path.relative_to(town_dir.parent)
        package = ".".join(name.parts[:-1])
        bad = sorted(
            m
            for m in absolute_imports(path, package)
            if any(m == f or m.startswith(f + ".") for f in forbidden)
        )
        if bad:
            found[str(name)] = bad
    return found


def test_the_town_never_imports_routing_internals_or_the_engine():
    town_dir = Path(town.__file__).parent
    assert town_importers(town_dir, TOWN_FORBIDDEN) == {}


def test_the_town_import_walk_sees_every_spelling(tmp_path):
    town_dir = tmp_path / "town"
    (town_dir / "services").mkdir(parents=True)
    (town_dir / "a.py").write_text("from inference.fleet.router import Router\n")
    (town_dir / "b.py").write_text("from inference.fleet import prefixes\n")
    (town_dir / "c.py").write_text("def f():\n    import inference.fleet.router\n")
    (town_dir / "services" / "d.py").write_text("from inference.engine.config import X\n")
    (town_dir / "e.py").write_text("from inference.services import completion_route\n")
    (town_dir / "f.py").write_text("from inference.completions.services import completion_model\n")
    found = town_importers(town_dir, TOWN_FORBIDDEN)
    assert set(found) == {"town/a.py", "town/b.py", "town/c.py", "town/services/d.py", "town/f.py"}


def _is_settings(node: ast.expr) -> bool:
    """`settings`, `django.conf.settings`, or something reached through them (settings.X[k])."""
    while isinstance(node, ast.Subscript | ast.Attribute):
        if isinstance(node, ast.Attribute) and node.attr == "settings":
            return True
        node = node.value
    return isinstance(node, ast.Name) and node.id == "settings"


def settings_writes(path: Path) -> list[int]:
    """Lines of `path` that assign, delete or setattr Django settings (or what they hold)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
            and _is_settings(node.args[0])
        ):
            lines.append(node.lineno)
        if any(isinstance(t, ast.Attribute | ast.Subscript) and _is_settings(t) for t in targets):
            lines.append(node.lineno)
    return lines


def test_the_town_and_inference_never_assign_django_settings_at_run_time():
    """An engine for a block of work is inference's to configure (inference/completions/runtime.py:
    engine_configured), beside the engine, never by rewriting INFERENCE_ENGINE."""
    package_dirs = [Path(town.__file__).parent, Path(inference.__file__).parent]
    found = {
        str(path.relative_to(ROOT)): lines
        for package_dir in package_dirs
        for path in sorted(package_dir.rglob("*.py"))
        if (lines := settings_writes(path))
    }
    assert found == {}


def test_the_settings_walk_sees_every_spelling(tmp_path):
    writes = {
        "settings.INFERENCE_ENGINE = {}": True,
        "settings.INFERENCE_ENGINE['model'] = 'x'": True,
        "settings.INFERENCE_NODES += ['a']": True,
        "django.conf.settings.X = 1": True,
        "setattr(settings, 'X', 1)": True,
        "del settings.X": True,
        "x = settings.INFERENCE_ENGINE": False,
        "engine = {**settings.INFERENCE_ENGINE}": False,
        "options.settings_name = 1": False,
    }
    for line, is_write in writes.items():
        path = tmp_path / "a.py"
        path.write_text(f"def f():\n    {line}\n")
        assert bool(settings_writes(path)) == is_write, line
