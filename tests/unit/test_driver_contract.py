"""The TaskManager and its Spark driver processes share a contract (shared/task_protocol.py,
shared/driver_contract.py), not each other's modules: the driver's code (services/taskmanager/
runtime/) imports nothing of the TaskManager's own modules, and the TaskManager's driver
management imports nothing of the driver's runtime."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TASKMANAGER = ROOT / "services" / "taskmanager"


def imported_modules(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def test_the_drivers_code_imports_no_taskmanager_module():
    taken = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in (TASKMANAGER / "runtime").rglob("*.py")
        for module in imported_modules(path)
        if module.startswith("services.taskmanager.") and not module.startswith("services.taskmanager.runtime")
    }
    assert not taken, taken


def test_the_driver_process_manager_imports_nothing_of_the_drivers_runtime():
    taken = {
        m for m in imported_modules(TASKMANAGER / "drivers/process.py") if m.startswith("services.taskmanager.runtime")
    }
    assert not taken, taken
