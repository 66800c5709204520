"""The dashboard's scripts are ES modules: index.html loads one (web-ui/app.js), which imports the
page modules of web-ui/js/, each with names of its own. As classic scripts they shared one global
scope, and a function two pages defined (renderHistory, in checkpoints.js and deployments.js) was
the one loaded last for both: a job's checkpoint history stayed empty. A page script loaded any
other way would bring that back; tests/browser/test_incident_views.py shows both tables filled."""

from __future__ import annotations

import re
from pathlib import Path

WEB = Path(__file__).resolve().parents[2] / "web-ui"
SCRIPT_TAG = re.compile(r"<script\b([^>]*)>", re.I)
IMPORT = re.compile(r"^import\s+(?:[\s\S]*?)\s+from\s+\"(\./[^\"]+)\";", re.M)


def imported_from(path: Path) -> set[Path]:
    return {(path.parent / rel).resolve() for rel in IMPORT.findall(path.read_text())}


def test_index_html_loads_one_module_and_no_classic_script():
    tags = SCRIPT_TAG.findall((WEB / "index.html").read_text())
    assert tags == [' src="/web/app.js" type="module"'], tags


def test_every_page_script_is_a_module_reached_from_app_js():
    seen: set[Path] = set()
    todo = [(WEB / "app.js").resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        assert path.is_file(), f"an import names {path}, which does not exist"
        seen.add(path)
        todo.extend(imported_from(path))
    scripts = {p.resolve() for p in (WEB / "js").glob("*.js")}
    assert scripts <= seen, f"not imported by the dashboard: {sorted(p.name for p in scripts - seen)}"
    for path in scripts:
        text = path.read_text()
        assert re.search(r"^export ", text, re.M), f"{path.name} exports nothing: is it a module?"
        assert '"use strict"' not in text, f"{path.name}: modules are strict; the marker belongs to classic scripts"
