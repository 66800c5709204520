"""Which kind of pipeline artifact a file is, by its name: the one rule the dispatcher's upload
and checks, the CLI and the driver's loader all apply (issue 43.15).

The suffix decides, in any letter case: `ok.PY` is a Python module and `job.Zip` a zip archive,
everywhere. A rule applied case-insensitively at upload but case-sensitively in the driver let
`ok.PY` pass upload and run, then fail in the driver; one function used by both cannot drift.
Members inside a zip are another matter: Python's own zip importer reads only `.py` members, so
a zip's modules keep the lower-case suffix (guards/archive_bounds.py checks the ones Python imports).
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Literal

Kind = Literal["py", "zip"]
KINDS: dict[str, Kind] = {".py": "py", ".zip": "zip"}
EXPECTED = "a .py module or a .zip of .py files (suffix in any letter case)"


def kind_of(name: str | PurePath) -> Kind | None:
    """ "py" or "zip" for an artifact's file name, else None."""
    return KINDS.get(PurePath(str(name)).suffix.lower())
