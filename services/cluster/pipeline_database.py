"""The database a local cluster's pipelines get when none is configured (`pipeline_catalog_url`):
an SQLite file of their own under the cluster's home, never the control catalog. So the README's
first job, the examples and the runbooks' specs, whose SQL sinks name no database, run on
`headrace up` as written."""

from __future__ import annotations

from shared.settings import Settings

DIRECTORY = "pipelines"
FILE = "pipelines.db"


def pipeline_database(settings: Settings) -> str:
    """The SQLite URL, in a directory the drivers' group may write (SQLite writes its journal
    beside the file, so the directory must be theirs, not only the file); every pipeline's
    driver shares this one database."""
    from services.taskmanager.drivers.user import give_to_drivers

    directory = settings.home / DIRECTORY
    directory.mkdir(parents=True, exist_ok=True)
    give_to_drivers(directory, settings.driver_user, files=(FILE,))
    return f"sqlite:///{directory / FILE}"
