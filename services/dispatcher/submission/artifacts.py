"""Uploaded job artifacts: a Python module (.py) or a zip of Python files (.zip).

Uploads are checked before they are kept, so a typo is reported at upload time with its line
rather than minutes later by a Spark driver: a .py must compile; a .zip must be a readable zip
whose .py members all compile, with no member escaping its directory. An upload is copied to a
temporary file beside its final place as it arrives and checked there, within the bounds of
guards/archive_bounds.py (never read whole into memory), then renamed to the artifact id.

What a listing shows and a submission checks (the module's top-level functions and names) is
computed once, at upload, and kept in the catalog (`artifacts.listing`): parsing every stored
file on every GET /jars made a listing as slow as its largest artifact.
"""

from __future__ import annotations

import ast
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from services.dispatcher.guards.archive_bounds import ArtifactLimits, ArtifactRejected, read_source, spool, zip_sources
from shared.artifact_kind import kind_of

log = logging.getLogger("headrace.dispatcher")

DEFAULT_ENTRY = "build"


@dataclass(frozen=True)
class CheckedArtifact:
    kind: str  # "py" | "zip"
    size: int
    sha256: str
    functions: tuple[str, ...] = ()  # top-level functions of a .py, in source order
    names: frozenset[str] = field(default_factory=frozenset)  # every top-level binding of a .py
    star_import: bool = False  # `from x import *`: names cannot be known statically
    not_callable: frozenset[str] = field(default_factory=frozenset)  # bound by `import x` or `class`


MAX_NAME_CHARS = 255  # artifacts.name


def safe_filename(filename: str | None) -> str:
    """The last path component of what the client called the file, without control characters
    (PostgreSQL refuses NUL) and short enough for the catalog, its suffix kept."""
    name = PurePosixPath((filename or "").replace("\\", "/")).name
    name = "".join(c for c in name if ord(c) >= 32).strip() or "upload"
    if len(name) > MAX_NAME_CHARS:
        suffix = PurePosixPath(name).suffix[:16]
        name = name[: MAX_NAME_CHARS - len(suffix)] + suffix
    return name


def check_suffix(filename: str) -> None:
    if kind_of(filename) is None:
        raise ArtifactRejected(
            f"'{filename}' is not a Python job: upload a .py module (with a top-level "
            f"'{DEFAULT_ENTRY}' function) or a .zip of .py files"
        )


def receive(src: IO[bytes], directory: Path, artifact_id: str, max_bytes: int) -> tuple[Path, int, str]:
    """Copy an upload beside its final place: (temporary path, size, sha256). A size above
    max_bytes means the copy stopped there (the caller refuses it and removes the file)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{artifact_id}.part"
    size, digest = spool(src, tmp, max_bytes)
    return tmp, size, digest


def check_file(filename: str, path: Path, size: int, sha256: str, limits: ArtifactLimits) -> CheckedArtifact:
    """Validate an upload copied to `path`; raises ArtifactRejected saying how to fix it."""
    check_suffix(filename)
    if size == 0:
        raise ArtifactRejected(f"'{filename}' is empty")
    if kind_of(filename) == "py":
        tree = _compile_module(filename, read_source(path, limits, filename))
        functions, names, star, not_callable = _top_level(tree)
        return CheckedArtifact("py", size, sha256, functions, names, star, not_callable)
    for member, source in zip_sources(path, limits, filename):
        _compile_module(filename, source, member=member)
    return CheckedArtifact("zip", size, sha256)


def module_entries(source: bytes) -> tuple[tuple[str, ...], frozenset[str], bool, frozenset[str]] | None:
    """`_top_level` of a module's source; None when it does not parse."""
    try:
        return _top_level(ast.parse(source.decode("utf-8-sig")))
    except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
        return None


def _compile_module(filename: str, data: bytes, *, member: str | None = None) -> ast.Module:
    where = f"{member} in {filename}" if member else filename
    try:
        source = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ArtifactRejected(
            f"{where} is not UTF-8 text (byte {exc.start}): save it as UTF-8", member=member
        ) from None
    try:
        compile(source, member or filename, "exec", dont_inherit=True)
        return ast.parse(source, member or filename)
    except SyntaxError as exc:
        text = (exc.text or "").strip()
        detail = f": {text}" if text else ""
        raise ArtifactRejected(
            f"{where} does not compile: {exc.msg} at line {exc.lineno}"
            f"{f', column {exc.offset}' if exc.offset else ''}{detail}",
            line=exc.lineno,
            member=member,
        ) from None
    except ValueError as exc:  # e.g. source with NUL bytes
        raise ArtifactRejected(f"{where} does not compile: {exc}", member=member) from None


def _top_level(tree: ast.Module) -> tuple[tuple[str, ...], frozenset[str], bool, frozenset[str]]:
    functions: list[str] = []
    names: set[str] = set()
    not_callable: set[str] = set()  # a pipeline's entry is never a module or a class
    star = False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append(node.name)
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            not_callable.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    star = True
                else:
                    names.add((alias.asname or alias.name).split(".")[0])
                    if isinstance(node, ast.Import):
                        not_callable.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.If, ast.Try)):
            # Definitions under `if`/`try` at module level (optional imports, fallbacks).
            inner = ast.Module(
                body=[n for n in ast.walk(node) if isinstance(n, ast.stmt) and n is not node], type_ignores=[]
            )
            _f, inner_names, inner_star, _n = _top_level(inner)
            names |= inner_names
            star = star or inner_star
    # A name also bound as a function or an assignment somewhere may be callable after all.
    return tuple(functions), frozenset(names), star, frozenset(not_callable - set(functions))


def module_names(
    path: Path, limits: ArtifactLimits = ArtifactLimits()
) -> tuple[tuple[str, ...], frozenset[str], bool, frozenset[str]] | None:
    """Top-level functions/names of a stored .py artifact, or None if it is not readable .py
    (or larger than the dispatcher parses)."""
    if kind_of(path) != "py":
        return None
    try:
        if path.stat().st_size > limits.source:
            return None
        return module_entries(path.read_bytes())
    except OSError:
        return None


def _listed(functions, names, star, not_callable) -> dict[str, Any]:
    return {
        "kind": "py",
        "functions": list(functions),
        "names": sorted(names),
        "star_import": star,
        "not_callable": sorted(not_callable),
    }


def listing(checked: CheckedArtifact) -> dict[str, Any]:
    """The catalog's record of what an artifact offers (`artifacts.listing`)."""
    if checked.kind != "py":
        return {"kind": checked.kind, "functions": None}
    return _listed(checked.functions, checked.names, checked.star_import, checked.not_callable)


def listing_of_file(path: Path) -> dict[str, Any]:
    """`listing` of an artifact stored before listings were kept: parsed once, then stored."""
    found = module_names(path)
    if found is None:
        return {"kind": kind_of(path) or "unknown", "functions": None}
    return _listed(*found)


def entry_names(listed: dict[str, Any]) -> tuple[tuple[str, ...], frozenset[str], bool, frozenset[str]] | None:
    """(functions, names, star import, names that cannot be an entry) of a .py artifact's
    listing; None when unknown (a zip)."""
    if listed.get("kind") != "py" or listed.get("functions") is None:
        return None
    return (
        tuple(listed["functions"]),
        frozenset(listed.get("names") or ()),
        bool(listed.get("star_import")),
        frozenset(listed.get("not_callable") or ()),
    )


def commit(tmp: Path, directory: Path, artifact_id: str) -> Path:
    """Give a checked upload its final name (atomically: a reader never sees half a file)."""
    target = directory / artifact_id
    os.replace(tmp, target)
    return target


def remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def stored_listing(catalog: Any, art: Any) -> dict:
    """The artifact's listing (its modules and their functions) as stored at upload; one uploaded
    before listings were kept is parsed this once and its listing stored."""
    if art.listing is not None:
        return art.listing
    from shared.catalog import repository

    listed = listing_of_file(Path(art.path))
    with catalog.session() as s:
        repository.set_artifact_listing(s, art.id, listed)
    log.info("recorded the listing of artifact %s (uploaded before listings were kept)", art.id)
    return listed
