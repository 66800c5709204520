"""Is the submitted entry a function the driver can call? Checked when POST /jars/{id}/run is
made, from the module's syntax tree (never by importing it: that would run the user's code in
the dispatcher).

The driver calls `getattr(module, entry)(ctx)` on the uploaded .py, or on the zip's pipeline
module (config `module`, else the zip's single top-level module or package; runner.load_pipeline).
A name bound only by `import x` (a module) or `class` cannot be the entry; a name bound by an
assignment or `from x import y` may be a function and is let through, as is any name in a module
that does `from x import *` (its names cannot be known without running it).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any, Callable

from services.dispatcher.errors import ApiError
from services.dispatcher.guards.archive_bounds import ArtifactLimits, zip_module_source
from services.dispatcher.submission import artifacts
from shared.artifact_kind import kind_of


def check_entry(art: Any, entry: str, config: dict, listing: Callable[[], dict], limits: ArtifactLimits) -> None:
    """Raise ApiError 400 (field entryClass) unless `entry` names a callable top-level binding
    of the module the driver would load. `listing()` gives the artifact's recorded listing."""
    if kind_of(art.path) == "zip":
        found, where = _zip_module_entries(Path(art.path), config, limits)
    else:
        found, where = artifacts.entry_names(listing()), art.name
    if found is None:
        return  # not parseable here (an old or unreadable artifact): the driver reports it
    functions, names, star, not_callable = found
    if entry in functions or (star and entry not in not_callable):
        return
    if entry in names and entry not in not_callable:
        return
    if entry in not_callable:
        message = f"{entry!r} in {where} is a module or a class, not a function"
    else:
        message = f"function {entry!r} is not defined at the top level of {where}"
    if functions:
        hint = f"pass entryClass with one of the module's top-level functions: {', '.join(functions)}"
    else:
        hint = f"define `def {entry}(ctx): ...` at the top level of {where}"
    raise ApiError.of(
        400,
        message,
        field="entryClass",
        expected=f"a top-level function of {where}",
        got=entry,
        hint=hint,
        prefix=False,
    )


def _zip_module_entries(path: Path, config: dict, limits: ArtifactLimits):
    module = config.get("module") if isinstance(config.get("module"), str) else None
    if module is None:
        module = _single_top_level(path)
        if module is None:
            return None, path.name
    source = zip_module_source(path, module, limits)
    if source is None:
        return None, f"module {module} of {path.name}"
    return artifacts.module_entries(source), f"module {module} of the uploaded zip"


def _single_top_level(path: Path) -> str | None:
    """As pipeline_loader.single_top_level, without raising: the driver reports a zip with several."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    tops = set()
    for name in names:
        head = PurePosixPath(name).parts[0] if name else ""
        if "/" in name and not head.endswith((".dist-info", ".egg-info", "__pycache__")):
            tops.add(head)
        elif name.endswith(".py") and "/" not in name:
            tops.add(name[:-3])
    return tops.pop() if len(tops) == 1 else None
