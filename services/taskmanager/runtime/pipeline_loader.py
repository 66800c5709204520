"""Loading a task's pipeline artifact: a `.py` file is imported as a module named after the
file; a `.zip` is put on sys.path (and shipped to Python workers) and the module
`config["module"]` is imported, or, without that key, the zip's single top-level module or
package."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

from shared.artifact_kind import EXPECTED, kind_of


def load_pipeline(artifact: str, config: dict[str, Any], spark: Any) -> ModuleType:
    from pyspark import cloudpickle

    path = Path(artifact)
    if not path.exists():
        raise FileNotFoundError(f"pipeline artifact {artifact} does not exist")
    kind = kind_of(path)
    if kind == "zip":
        module_name = config.get("module") or single_top_level(path)
        sys.path.insert(0, str(path))
        spark.sparkContext.addPyFile(str(path))  # workers import it by reference
        return importlib.import_module(module_name)
    if kind != "py":
        raise ValueError(f"pipeline artifact must be {EXPECTED}, not {path.name}")
    # An explicit loader: the standard one is chosen by the suffix and knows only a lower-case ".py".
    loader = importlib.machinery.SourceFileLoader(path.stem, str(path))
    spec = importlib.util.spec_from_file_location(path.stem, path, loader=loader)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    sys.path.insert(0, str(path.parent))
    spec.loader.exec_module(module)
    # Workers cannot import a loose file: functions defined in it travel by value.
    cloudpickle.register_pickle_by_value(module)
    return module


def single_top_level(path: Path) -> str:
    with zipfile.ZipFile(path) as z:
        tops = set()
        for name in z.namelist():
            head = name.split("/", 1)[0]
            if "/" in name and not head.endswith((".dist-info", ".egg-info", "__pycache__")):
                tops.add(head)
            elif name.endswith(".py") and "/" not in name:
                tops.add(name[:-3])
    if len(tops) != 1:
        raise ValueError(f"{path.name} holds {sorted(tops) or 'no'} top-level modules: name one with config `module`")
    return tops.pop()
