"""Modules that find files of the checkout by their own location: each must point at the
repository root, wherever the module lives (a module moved into a package once made
`headrace demo` look for services/examples/ and the Spark executors import from services/)."""

from pathlib import Path

from services.cluster import demo, spark_standalone
from services.dispatcher import app, restore_check
from services.taskmanager import driver_env, driver_user
from services.taskmanager.runtime import spark_session

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_finds_its_example():
    assert demo.EXAMPLE.is_file() and demo.EXAMPLE == ROOT / "examples" / "clickstream.py"


def test_repo_roots_are_the_repository():
    for root in (restore_check.REPO_ROOT, driver_env.REPO_ROOT, driver_user.REPO_ROOT, spark_session.REPO_ROOT):
        assert Path(root) == ROOT, root
    assert app.DEFAULT_WEB_DIR == ROOT / "web-ui"


def test_spark_executors_import_from_the_repository(tmp_path):
    env = spark_standalone.environment({}, host="127.0.0.1", log_dir=tmp_path)
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT)
