"""The jars Headrace takes from Maven Central, and the cache that holds them.

`shared/jar_sets.toml` names each set (Spark's Kafka connector, Delta Lake, the Kafka broker)
with its coordinates. `scripts/bootstrap` fetches them with Maven at set-up time (`headrace jars
fetch`; `headrace jars check|classpath SET` tell what is there, services/cli/jars.py).

Each set lands in `<jar_cache_dir>/<set>-<digest>/`, the digest taken over the set's entry, so
a changed version is a new directory and an old cache can never stand in for it. A directory
counts only once its MANIFEST is written, after Maven has copied every jar into a staging
directory that is then renamed into place: a fetch that was interrupted leaves nothing a reader
would use. Nothing here ever reaches the network at run time: a set that is missing is a
`MissingJars` naming scripts/bootstrap, raised where a process starts (`headrace up`, a
TaskManager, a planner), never a ClassNotFoundException inside a task.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from shared import errors

SETS_FILE = Path(__file__).with_name("jar_sets.toml")
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "headrace" / "jars"
MANIFEST = "MANIFEST.json"
# The sets every Spark session of ours gets (drivers, executors, planners, the class archive).
SPARK_SETS = ("spark-kafka", "delta")
KAFKA_BROKER = "kafka-broker"
# Delta's SQL extension and catalog, set when a session starts (they cannot be added later): Delta
# refuses MERGE, OPTIMIZE and VACUUM in a session without them.
DELTA_SESSION_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
FETCH_TIMEOUT_S = 900.0
BOOTSTRAP_HINT = "run scripts/bootstrap (or headrace jars fetch) on this machine"


class MissingJars(errors.ClusterError, RuntimeError):
    """A jar set is not in the cache, or does not fit the installed Spark."""


@dataclass(frozen=True)
class JarSet:
    name: str
    artifacts: tuple[str, ...]
    transitive: bool
    spark_version: str | None = None

    @property
    def digest(self) -> str:
        text = json.dumps([self.name, self.artifacts, self.transitive, self.spark_version])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def pom(self) -> str:
        """A Maven project whose dependencies are this set's artifacts."""
        deps = []
        for coordinate in self.artifacts:
            group, artifact, version = coordinate.split(":")
            deps.append(
                f"<dependency><groupId>{escape(group)}</groupId><artifactId>{escape(artifact)}</artifactId>"
                f"<version>{escape(version)}</version></dependency>"
            )
        return (
            '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            f"<groupId>headrace.jars</groupId><artifactId>{escape(self.name)}</artifactId><version>1</version>"
            f"<packaging>pom</packaging><dependencies>{''.join(deps)}</dependencies></project>\n"
        )


def load_sets(path: Path = SETS_FILE) -> dict[str, JarSet]:
    data = tomllib.loads(path.read_text())
    out = {}
    for name, entry in data.items():
        artifacts = tuple(entry["artifacts"])
        for coordinate in artifacts:
            if coordinate.count(":") != 2:
                raise ValueError(f"{path}: [{name}] artifact {coordinate!r} is not group:artifact:version")
        out[name] = JarSet(name, artifacts, bool(entry.get("transitive", False)), entry.get("spark_version"))
    return out


def installed_spark_version() -> str | None:
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        return None


class JarCache:
    """The cache directory (the setting jar_cache_dir) and the sets in it."""

    def __init__(self, root: Path, sets: dict[str, JarSet] | None = None):
        self.root = Path(root)
        self.sets = sets if sets is not None else load_sets()

    def directory(self, name: str) -> Path:
        s = self._set(name)
        return self.root / f"{s.name}-{s.digest}"

    def is_complete(self, name: str) -> bool:
        return (self.directory(name) / MANIFEST).is_file()

    def jars(self, name: str) -> list[Path]:
        """The set's jars; MissingJars if it was never fetched or does not fit this Spark."""
        s = self._set(name)
        spark = installed_spark_version()
        if s.spark_version and spark and s.spark_version != spark:
            raise MissingJars(
                f"the jar set {name} is built for Spark {s.spark_version} but PySpark {spark} is "
                f"installed: install pyspark=={s.spark_version} (pip install -e .), or change "
                f"{SETS_FILE.name} and {BOOTSTRAP_HINT}"
            )
        directory = self.directory(name)
        try:
            listed = json.loads((directory / MANIFEST).read_text())["jars"]
        except (OSError, ValueError, KeyError):
            raise MissingJars(f"the jars of {name} are not in {directory}: {BOOTSTRAP_HINT}") from None
        paths = [directory / jar for jar in listed]
        absent = [p.name for p in paths if not p.is_file()]
        if absent:
            raise MissingJars(f"the jar set {name} in {directory} lacks {', '.join(absent)}: {BOOTSTRAP_HINT}")
        return paths

    def spark_jars(self) -> list[Path]:
        """What every Spark session of ours puts on its class path (spark.jars)."""
        return [jar for name in SPARK_SETS for jar in self.jars(name)]

    def spark_conf(self) -> dict[str, str]:
        """The Spark settings that put the jars on a session's class path (the driver's and its
        executors', wherever they run: the driver serves them) and turn Delta on."""
        return {"spark.jars": ",".join(str(j) for j in self.spark_jars()), **DELTA_SESSION_CONF}

    def missing(self) -> list[str]:
        """One line per set that cannot be used as it is."""
        out = []
        for name in self.sets:
            try:
                self.jars(name)
            except MissingJars as exc:
                out.append(str(exc))
        return out

    def fetch(self, name: str, *, echo=print) -> Path:
        """Copy the set's jars from Maven into its directory, unless it is complete already."""
        target = self.directory(name)
        if self.is_complete(name):
            return target
        mvn = shutil.which("mvn")
        if mvn is None:
            raise MissingJars("Maven is not installed (Debian: apt-get install maven); it fetches the jars")
        s = self._set(name)
        self.root.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=self.root))
        try:
            (stage / "pom.xml").write_text(s.pom())
            cmd = [
                mvn,
                "-q",
                "-B",
                "-f",
                str(stage / "pom.xml"),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={stage / 'jars'}",
                "-DincludeScope=runtime",
            ]
            if not s.transitive:
                cmd.append("-DexcludeTransitive=true")
            echo(
                f"jars: fetching {name} ({len(s.artifacts)} artifacts{', with dependencies' if s.transitive else ''}) "
                "from Maven Central"
            )
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
            if done.returncode != 0:
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
                raise MissingJars(f"Maven could not fetch the jar set {name}:\n{tail}")
            jars = sorted(p.name for p in (stage / "jars").glob("*.jar"))
            for p in (stage / "jars").iterdir():
                p.rename(stage / p.name)
                os.chmod(stage / p.name, 0o644)  # drivers run as another user (drivers/user.py)
            (stage / "jars").rmdir()
            (stage / "pom.xml").unlink()
            (stage / MANIFEST).write_text(
                json.dumps({"set": name, "artifacts": list(s.artifacts), "jars": jars}, indent=1)
            )
            os.chmod(stage, 0o755)
            if target.exists():  # an incomplete one left by an older fetcher
                shutil.rmtree(target)
            stage.rename(target)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return target

    def _set(self, name: str) -> JarSet:
        try:
            return self.sets[name]
        except KeyError:
            raise MissingJars(f"no jar set {name!r} in {SETS_FILE.name}; known: {', '.join(self.sets)}") from None
