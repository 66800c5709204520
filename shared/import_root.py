"""Where Headrace's own packages are imported from: the repository's root in a checkout, the
site-packages directory of an installed wheel.

Every process running Headrace code that is not a service (Spark drivers, their Python workers
and executors, the dispatcher's restore planner) starts in a directory of its own and gets this
first on PYTHONPATH, so it imports the same copy of `services` and `shared` as the service that
started it."""

from pathlib import Path

IMPORT_ROOT = Path(__file__).resolve().parents[1]
