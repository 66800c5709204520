"""Field types of the REST bodies and query strings that refuse what a lax parser would guess at.

pydantic's `bool` reads "yes", "on", "1", "y" and 1 as true: `"cancel-job": "yes"` cancelled a
job nobody asked to cancel. Flink's own REST mapper (Jackson) takes JSON true/false and the
strings "true"/"false"; so does `StrictBool`, in any letter case, and nothing else.

An entry function is looked up with `getattr(module, entry)` by the driver (runtime/driver.py, Driver._build), so a
dotted name such as "os.system" can never be found: `EntryName` is one Python identifier.
"""

from __future__ import annotations

import keyword
from typing import Annotated, Any

from pydantic import BeforeValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from shared.booleans import parse_boolean

MAX_ENTRY_CHARS = 255
BOOL_EXPECTED = 'true or false (a JSON boolean, or the string "true" or "false")'
ENTRY_EXPECTED = "the name of a top-level function of the module, such as 'build' (one Python identifier)"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def strict_bool(value: Any) -> bool:
    """True/False from a JSON boolean or the string "true"/"false"; anything else raises."""
    try:
        return parse_boolean(value)
    except ValueError:
        pass
    raise PydanticCustomError(
        "strict_bool",
        "must be {expected}, got {got}",
        {
            "expected": BOOL_EXPECTED,
            "got": _short(value),
            "hint": "write true or false; other spellings (yes, 1, on) are refused",
        },
    )


def entry_problem(value: Any) -> str | None:
    """Why `value` cannot name an entry function (None when it can)."""
    if not isinstance(value, str) or not value:
        return "is empty or not a string"
    if len(value) > MAX_ENTRY_CHARS:
        return f"is longer than {MAX_ENTRY_CHARS} characters"
    if "." in value or ":" in value:
        return "names an attribute of another module; the driver calls a function defined in the uploaded module itself"
    if not value.isidentifier() or keyword.iskeyword(value):
        return "is not a Python identifier"
    return None


def entry_name(value: Any) -> str:
    problem = entry_problem(value)
    if problem is None:
        return value
    raise PydanticCustomError(
        "entry",
        "must be a Python function name: it {problem}, got {got}",
        {
            "problem": problem,
            "expected": ENTRY_EXPECTED,
            "got": _short(value),
            "hint": "define `def build(ctx): ...` (or another name passed as entryClass) at "
            "the top level of the uploaded .py (in a .zip: of its pipeline module)",
        },
    )


StrictBool = Annotated[bool, BeforeValidator(strict_bool), WithJsonSchema({"type": "boolean"})]
EntryName = Annotated[
    str,
    BeforeValidator(entry_name),
    WithJsonSchema({"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$", "maxLength": MAX_ENTRY_CHARS}),
]
