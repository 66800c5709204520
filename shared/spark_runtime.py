"""What every Spark JVM of ours starts with besides PySpark itself: the jars from Maven Central
(shared/jars.py) and, where it is on, the drivers' class-data-sharing archive. One value that the
services build from their settings and hand to the processes that start Spark (drivers,
planners) as command-line arguments: those processes run as another user, without the
services' settings file.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.jars import DEFAULT_CACHE_DIR, JarCache


@dataclass(frozen=True)
class SparkRuntime:
    jar_cache_dir: Path
    class_archive_dir: Path | None = None  # None: no class archive

    @classmethod
    def from_settings(cls, settings: Any) -> "SparkRuntime":
        return cls(
            jar_cache_dir=settings.jar_cache_dir,
            class_archive_dir=settings.driver_class_archive_dir if settings.driver_class_archive else None,
        )

    @property
    def jars(self) -> JarCache:
        return JarCache(self.jar_cache_dir)

    def check(self) -> None:
        """MissingJars (naming scripts/bootstrap) unless every Spark jar set is in the cache."""
        self.jars.spark_jars()

    def paths(self) -> list[Path]:
        """What a process that starts Spark reads (drivers/user.py makes them reachable)."""
        return [self.jar_cache_dir, *([self.class_archive_dir] if self.class_archive_dir else [])]

    def cli_args(self) -> list[str]:
        args = ["--jar-cache", str(self.jar_cache_dir)]
        return args + (["--class-archive-dir", str(self.class_archive_dir)] if self.class_archive_dir else [])

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--jar-cache",
            type=Path,
            default=DEFAULT_CACHE_DIR,
            help="the jar cache (shared/jars.py): Spark's Kafka connector and Delta Lake "
            "(default: this user's, ~/.cache/headrace/jars)",
        )
        parser.add_argument(
            "--class-archive-dir",
            type=Path,
            default=None,
            help="where the drivers' class-data-sharing archive is (class_archive.py); none: off",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "SparkRuntime":
        return cls(jar_cache_dir=args.jar_cache, class_archive_dir=args.class_archive_dir)
