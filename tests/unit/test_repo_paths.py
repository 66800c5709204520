"""Modules that find files by their own location. In a checkout: the package data links lead to
the repository's web-ui/ and examples/, and the import root every child process gets first on
PYTHONPATH is the repository's root (a module moved into a package once made `headrace demo` look
for services/examples/ and the Spark executors import from services/). An installed wheel holds
copies instead: tests/integration/test_wheel_install.py."""

from pathlib import Path

from services.cluster import demo, spark_standalone
from services.dispatcher import app
from services.dispatcher.submission import restore_check
from services.taskmanager.drivers import env as driver_env
from services.taskmanager.drivers import user as driver_user
from services.taskmanager.runtime import spark_session
from shared.import_root import IMPORT_ROOT

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_finds_its_example():
    assert demo.EXAMPLE.is_file() and demo.EXAMPLE == ROOT / "examples" / "clickstream.py"


def test_the_dispatcher_finds_the_dashboard():
    assert app.DEFAULT_WEB_DIR == ROOT / "web-ui" and (app.DEFAULT_WEB_DIR / "index.html").is_file()


def test_the_package_data_are_links_into_the_repository():
    # A copy would drift from web-ui/ and examples/, which the docs, tests and benchmarks use.
    for link, target in (("services/dispatcher/web_ui", "web-ui"), ("services/cluster/examples", "examples")):
        assert (ROOT / link).is_symlink() and (ROOT / link).resolve() == ROOT / target, link


def test_the_import_root_is_the_repository():
    assert IMPORT_ROOT == ROOT
    for module in (restore_check, driver_env, driver_user, spark_session):
        assert module.IMPORT_ROOT is IMPORT_ROOT, module.__name__
    assert ROOT / "services" in driver_user.runtime_paths()


def test_spark_executors_import_from_the_repository(tmp_path):
    env = spark_standalone.environment({}, host="127.0.0.1", log_dir=tmp_path)
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT)
