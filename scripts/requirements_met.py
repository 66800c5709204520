"""Exit 0 when every dependency pyproject.toml declares (and its dev extra) is installed in a
version it allows, else print what is not and exit 1: scripts/bootstrap then runs pip, so a
changed pin (PySpark for the connector jars, pytest for the suite's plugins) reaches a machine
where Headrace was installed before."""

from __future__ import annotations

import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # a machine without it has not had Headrace's packages installed yet
    print("bootstrap: the Python package packaging is not installed")
    sys.exit(1)


def unmet(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    out = []
    for spec in [*project["dependencies"], *project.get("optional-dependencies", {}).get("dev", [])]:
        req = Requirement(spec)
        try:
            installed = version(req.name)
        except PackageNotFoundError:
            out.append(f"{req.name} is not installed ({spec})")
            continue
        if req.specifier and not req.specifier.contains(installed, prereleases=True):
            out.append(f"{req.name} {installed} is installed, {spec} is required")
    return out


if __name__ == "__main__":
    problems = unmet(Path(__file__).resolve().parent.parent / "pyproject.toml")
    for p in problems:
        print(f"bootstrap: {p}")
    sys.exit(1 if problems else 0)
