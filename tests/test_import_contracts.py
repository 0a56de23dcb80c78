"""The two pure cores, the engine (inference/engine/) and the town's rules (town/rules/), import
nothing of the Django side, and nothing of the product imports the benchmarks beside it
(benchmarks/ imports the engine, never the reverse): the import-linter contracts in
pyproject.toml, checked here, and a plain walk over their files for what the contracts cannot
see (an import inside a function is seen by both; an import of a sibling package added later is
caught by the walk)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import inference.engine
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
