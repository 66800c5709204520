"""Headrace's own small jar: Hadoop's local file system without a process per file
(services/taskmanager/jvm/io/headrace/fs/).

Without Hadoop's native library (no Maven artifact carries it), Hadoop's local file system runs
`chmod` for every file and directory it creates and `readlink` for a link status, each a fork of
the driver's JVM of a gigabyte (~5 ms, more under load): a streaming micro-batch writes its
offsets, its commit, a state file per state partition and their checksums, ~10 forks a batch,
and a Delta commit more (docs/benchmarks.md, "Hadoop's forks"). The classes here do both with
Java's own file API.

Built from the source at set-up time (`headrace jars fetch`, which scripts/bootstrap runs) with the
JDK's `javac` against the Hadoop API jar PySpark ships, into the jar cache, named by a digest of
the sources and that jar, so a changed source or PySpark is a new jar. A session uses it only where
it is there and only with a local engine (executors in the driver's JVM): the executors of a Spark
cluster load classes from their own hosts, which may not have it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from shared import errors

SOURCES = Path(__file__).resolve().parent.parent / "services" / "taskmanager" / "jvm"
FILE_SYSTEM = "io.headrace.fs.NioLocalFileSystem"
ABSTRACT_FILE_SYSTEM = "io.headrace.fs.NioLocalFs"
BUILD_TIMEOUT_S = 180.0


class LocalFsJarError(errors.ClusterError, RuntimeError):
    """The jar could not be built (no JDK compiler, no Hadoop API jar in PySpark)."""


def _hadoop_api_jar() -> Path | None:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    jars = Path(list(spec.submodule_search_locations)[0]) / "jars"
    found = sorted(jars.glob("hadoop-client-api-*.jar"))
    return found[-1] if found else None


def _sources() -> list[Path]:
    return sorted(SOURCES.rglob("*.java"))


def jar_path(cache_dir: Path) -> Path | None:
    """Where this checkout's jar for the installed PySpark is (built or not); None without PySpark."""
    api = _hadoop_api_jar()
    if api is None:
        return None
    digest = hashlib.sha256(api.name.encode())
    for source in _sources():
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return Path(cache_dir) / f"headrace-localfs-{digest.hexdigest()[:16]}.jar"


def built(cache_dir: Path) -> Path | None:
    """The jar if it has been built, else None (a session then keeps Hadoop's own file system)."""
    path = jar_path(cache_dir)
    return path if path is not None and path.is_file() else None


def spark_conf(cache_dir: Path) -> dict[str, str]:
    """A local session's settings that put the jar on the driver's class path and use it for
    file: paths, through Hadoop's FileSystem and its FileContext; nothing without the jar."""
    jar = built(cache_dir)
    if jar is None:
        return {}
    return {
        "spark.driver.extraClassPath": str(jar),
        "spark.hadoop.fs.file.impl": FILE_SYSTEM,
        "spark.hadoop.fs.AbstractFileSystem.file.impl": ABSTRACT_FILE_SYSTEM,
    }


def ensure(cache_dir: Path) -> Path:
    """Build the jar unless it is there; its path. LocalFsJarError when it cannot be built."""
    path = jar_path(cache_dir)
    api = _hadoop_api_jar()
    if path is None or api is None:
        raise LocalFsJarError("PySpark (and the Hadoop API jar it ships) is not installed")
    if path.is_file():
        return path
    home = os.environ.get("JAVA_HOME")
    javac = (shutil.which("javac", path=os.path.join(home, "bin")) if home else None) or shutil.which("javac")
    if javac is None:
        raise LocalFsJarError("no javac: install a JDK (Debian: openjdk-17-jdk-headless)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="headrace-localfs-") as work:
        classes = Path(work) / "classes"
        done = subprocess.run(
            [javac, "--release", "17", "-nowarn", "-cp", str(api), "-d", str(classes), *map(str, _sources())],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        if done.returncode != 0:
            raise LocalFsJarError(f"javac failed: {(done.stderr or done.stdout).strip()[-2000:]}")
        staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with zipfile.ZipFile(staging, "w", zipfile.ZIP_DEFLATED) as jar:
            for item in sorted(classes.rglob("*.class")):
                jar.write(item, item.relative_to(classes).as_posix())
        os.replace(staging, path)  # readers see a whole jar or none
    return path
