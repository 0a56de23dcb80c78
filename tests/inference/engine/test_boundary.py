"""The engine stays free of Django-side code: nothing under inference/engine imports it."""

import ast
from pathlib import Path

import inference.engine

FORBIDDEN = {
    "django",
    "celery",
    "channels",
    "rest_framework",
    "drf_spectacular",
    "pokosite",
    "town",
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_engine_imports_no_django_side_code():
    engine_dir = Path(inference.engine.__file__).parent
    offenders = {
        str(path.relative_to(engine_dir)): sorted(imported_roots(path) & FORBIDDEN)
        for path in engine_dir.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_engine_never_reads_the_environment():
    engine_dir = Path(inference.engine.__file__).parent
    readers = [p.name for p in engine_dir.rglob("*.py") if "os.environ" in p.read_text()]
    assert readers == []


def test_the_model_runner_never_imports_the_scheduler():
    """It reads SchedulerOutput from its own module; the scheduler's internals are not its."""
    import inference.engine.model_runner as model_runner

    tree = ast.parse(Path(model_runner.__file__).read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in modules if m and m.split(".")[-1] in ("scheduler", "kv_cache_manager")}
