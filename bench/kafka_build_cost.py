"""What a Kafka pipeline's build(ctx) pays on a warmed driver that never touched Kafka: the Python
client's import, Spark's Kafka source classes (the first `format("kafka").load()` against the
second), and the brokers' reachability check (a fresh AdminClient listing the topics), first and
again; after the warm-up without and with its Kafka step (warm_up.warm_up_kafka). One
driver-like session (runtime/spark_session.py's build_spark, runtime/warm_up.py's warm_up) per
fresh process, a broker on a free port; each figure the median of --rounds processes, the two kinds alternating.

    python3 bench/kafka_build_cost.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one_process(bootstrap: str, warm_kafka: bool) -> dict[str, float]:
    """In this (fresh) process: a warmed session, then the Kafka steps of a build, timed."""
    from services.taskmanager.runtime import spark_session, warm_up
    from services.taskmanager.runtime.connectors.kafka_source import check_reachable

    work = tempfile.mkdtemp(prefix="hr-kafka-build-")
    spark_session.prepare_env()
    spark = spark_session.build_spark(2, work)
    if not warm_kafka:  # the warm-up as it was before warm_up_kafka
        warm_up.warm_up_kafka = lambda _spark: None  # type: ignore[assignment]
    warm_up.warm_up(spark, work, 2)
    out: dict[str, float] = {}

    def timed(name, fn):
        t0 = time.perf_counter()
        fn()
        out[name] = round((time.perf_counter() - t0) * 1000, 1)

    opts = {"kafka.bootstrap.servers": bootstrap}
    timed("import confluent_kafka.admin", lambda: __import__("confluent_kafka.admin"))
    for n in (1, 2):
        timed(
            f"Kafka source load() #{n}",
            lambda: spark.readStream.format("kafka").options(**opts, subscribe="t").load().select("value").schema,
        )
        timed(f"check_reachable #{n}", lambda: check_reachable(opts, names=[]))
    spark.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--warm-kafka", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print(json.dumps(one_process(a.one, a.warm_kafka)))
        return
    from bench.kafka_bench import start_broker

    broker = start_broker(Path(tempfile.mkdtemp(prefix="hr-kafka-build-bench-")))
    try:
        results: dict[str, dict[str, list[float]]] = {"plain warm-up": {}, "with the Kafka warm-up": {}}
        for _ in range(a.rounds):
            for kind, flag in (("plain warm-up", []), ("with the Kafka warm-up", ["--warm-kafka"])):
                line = (
                    subprocess.run(
                        [sys.executable, __file__, "--one", broker.bootstrap, *flag],
                        check=True,
                        capture_output=True,
                        text=True,
                    )
                    .stdout.strip()
                    .splitlines()[-1]
                )
                for k, v in json.loads(line).items():
                    results[kind].setdefault(k, []).append(v)
        for kind, figures in results.items():
            print(f"{kind}: " + ", ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in figures.items()))
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
