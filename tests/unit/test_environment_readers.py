"""docs/architecture.md says shared/settings.py reads every setting and names the other
`HEADRACE_*` variables a service reads or sets, with where: every such name in services/ and
shared/ is a setting's variable, or is named there."""

from __future__ import annotations

import re
from pathlib import Path

from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
LITERAL = re.compile(r"[\"'](HEADRACE_[A-Z0-9_]*[A-Z0-9])_?[\"']")
# Variables of the Compose deployment's generated credentials file (services/cluster/
# compose_credentials.py, deploy/README.md), written and read there, never by a service.
COMPOSE_FILE = {"HEADRACE_REDIS_PASSWORD", "HEADRACE_TASKMANAGER"}


def test_every_headrace_variable_outside_the_settings_is_documented():
    settings = {f"HEADRACE_{name.upper()}" for name in Settings.model_fields}
    documented = set(re.findall(r"HEADRACE_[A-Z0-9_]*[A-Z0-9]", (ROOT / "docs/architecture.md").read_text()))
    found = {}
    for path in [*(ROOT / "services").rglob("*.py"), *(ROOT / "shared").rglob("*.py")]:
        for name in LITERAL.findall(path.read_text()):
            found.setdefault(name, path.relative_to(ROOT))
    unexplained = {name: str(path) for name, path in found.items() if name not in settings | documented | COMPOSE_FILE}
    assert not unexplained, f"HEADRACE_* variables neither settings nor in docs/architecture.md: {unexplained}"
    assert {"HEADRACE_TOKEN", "HEADRACE_ZOOKEEPER_HOME", "HEADRACE_SPARK_UI"} <= set(found)  # the scan sees them
