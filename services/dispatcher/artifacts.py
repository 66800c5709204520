"""Uploaded job artifacts: a Python module (.py) or a zip of Python files (.zip).

Uploads are checked before they are stored, so a typo is reported at upload time with its line
rather than minutes later by a Spark driver: a .py must compile; a .zip must be a readable zip
whose .py members all compile, with no member escaping its directory. Files are written
atomically (temporary name, then rename) under `settings.artifacts`, named by the artifact id.

What a listing shows and a submission checks (the module's top-level functions and names) is
computed once, at upload, and kept in the catalog (`artifacts.listing`): parsing every stored
file on every GET /jars made a listing as slow as its largest artifact.
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

ACCEPTED_SUFFIXES = (".py", ".zip")
DEFAULT_ENTRY = "build"


class ArtifactRejected(ValueError):
    """An upload that cannot be a job: wrong type, does not compile, broken zip."""

    def __init__(self, message: str, *, line: int | None = None, member: str | None = None):
        super().__init__(message)
        self.line = line
        self.member = member


@dataclass(frozen=True)
class CheckedArtifact:
    kind: str  # "py" | "zip"
    size: int
    sha256: str
    functions: tuple[str, ...] = ()  # top-level functions of a .py, in source order
    names: frozenset[str] = field(default_factory=frozenset)  # every top-level binding of a .py
    star_import: bool = False  # `from x import *`: names cannot be known statically


MAX_NAME_CHARS = 255  # artifacts.name


def safe_filename(filename: str | None) -> str:
    """The last path component of what the client called the file, without control characters
    (PostgreSQL refuses NUL) and short enough for the catalog, its suffix kept."""
    name = PurePosixPath((filename or "").replace("\\", "/")).name
    name = "".join(c for c in name if ord(c) >= 32).strip() or "upload"
    if len(name) > MAX_NAME_CHARS:
        suffix = PurePosixPath(name).suffix[:16]
        name = name[:MAX_NAME_CHARS - len(suffix)] + suffix
    return name


def check(filename: str, data: bytes) -> CheckedArtifact:
    """Validate an upload; raises ArtifactRejected with a message that says how to fix it."""
    suffix = Path(filename).suffix.lower()
    if suffix not in ACCEPTED_SUFFIXES:
        raise ArtifactRejected(
            f"'{filename}' is not a Python job: upload a .py module (with a top-level "
            f"'{DEFAULT_ENTRY}' function) or a .zip of .py files")
    if not data:
        raise ArtifactRejected(f"'{filename}' is empty")
    digest = hashlib.sha256(data).hexdigest()
    if suffix == ".py":
        tree = _compile_module(filename, data)
        functions, names, star = _top_level(tree)
        return CheckedArtifact("py", len(data), digest, functions, names, star)
    _check_zip(filename, data)
    return CheckedArtifact("zip", len(data), digest)


def _compile_module(filename: str, data: bytes, *, member: str | None = None) -> ast.Module:
    where = f"{member} in {filename}" if member else filename
    try:
        source = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ArtifactRejected(f"{where} is not UTF-8 text (byte {exc.start}): save it as UTF-8",
                               member=member) from None
    try:
        compile(source, member or filename, "exec", dont_inherit=True)
        return ast.parse(source, member or filename)
    except SyntaxError as exc:
        text = (exc.text or "").strip()
        detail = f": {text}" if text else ""
        raise ArtifactRejected(
            f"{where} does not compile: {exc.msg} at line {exc.lineno}"
            f"{f', column {exc.offset}' if exc.offset else ''}{detail}",
            line=exc.lineno, member=member) from None
    except ValueError as exc:  # e.g. source with NUL bytes
        raise ArtifactRejected(f"{where} does not compile: {exc}", member=member) from None


def _top_level(tree: ast.Module) -> tuple[tuple[str, ...], frozenset[str], bool]:
    functions: list[str] = []
    names: set[str] = set()
    star = False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append(node.name)
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
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
        elif isinstance(node, (ast.If, ast.Try)):
            # Definitions under `if`/`try` at module level (optional imports, fallbacks).
            inner = ast.Module(body=[n for n in ast.walk(node) if isinstance(n, ast.stmt) and n is not node],
                               type_ignores=[])
            _f, inner_names, inner_star = _top_level(inner)
            names |= inner_names
            star = star or inner_star
    return tuple(functions), frozenset(names), star


def _check_zip(filename: str, data: bytes) -> None:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise ArtifactRejected(f"'{filename}' is not a valid zip archive ({exc})") from None
    with zf:
        bad = zf.testzip()
        if bad is not None:
            raise ArtifactRejected(f"'{filename}' is corrupt: member {bad} fails its CRC check")
        py = []
        for info in zf.infolist():
            p = PurePosixPath(info.filename)
            if p.is_absolute() or ".." in p.parts:
                raise ArtifactRejected(f"'{filename}' member {info.filename} points outside the archive")
            if not info.is_dir() and p.suffix == ".py":
                py.append(info)
        if not py:
            raise ArtifactRejected(f"'{filename}' contains no .py files: zip your pipeline's Python modules")
        for info in py:
            _compile_module(filename, zf.read(info), member=info.filename)


def module_names(path: Path) -> tuple[tuple[str, ...], frozenset[str], bool] | None:
    """Top-level functions/names of a stored .py artifact, or None if it is not readable .py."""
    if path.suffix.lower() != ".py":
        return None
    try:
        return _top_level(ast.parse(path.read_bytes().decode("utf-8-sig")))
    except (OSError, SyntaxError, ValueError):
        return None


def listing(checked: CheckedArtifact) -> dict[str, Any]:
    """The catalog's record of what an artifact offers (`artifacts.listing`)."""
    if checked.kind != "py":
        return {"kind": checked.kind, "functions": None}
    return {"kind": "py", "functions": list(checked.functions), "names": sorted(checked.names),
            "star_import": checked.star_import}


def listing_of_file(path: Path) -> dict[str, Any]:
    """`listing` of an artifact stored before listings were kept: parsed once, then stored."""
    found = module_names(path)
    if found is None:
        return {"kind": path.suffix.lower().lstrip(".") or "unknown", "functions": None}
    functions, names, star = found
    return {"kind": "py", "functions": list(functions), "names": sorted(names), "star_import": star}


def entry_names(listed: dict[str, Any]) -> tuple[tuple[str, ...], frozenset[str], bool] | None:
    """(functions, names, star import) of a .py artifact's listing; None when unknown (a zip)."""
    if listed.get("kind") != "py" or listed.get("functions") is None:
        return None
    return (tuple(listed["functions"]), frozenset(listed.get("names") or ()), bool(listed.get("star_import")))


def store(directory: Path, artifact_id: str, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / artifact_id
    tmp = directory / f".{artifact_id}.part"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return target


def remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
