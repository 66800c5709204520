"""What a job's state partitions (spark.sql.shuffle.partitions, or pipeline.max-parallelism)
cost per micro-batch: the same stateful count per key (1,000 keys, Spark's rate source at
--rate rows/s, the default state store) at 4, 16 and 64 partitions, one query after another in
one local[2] session, alternating the counts over --rounds rounds so that the machine's drift
falls on all of them. Reported: the median and p90 of the batches' durations (Spark's
durationMs.triggerExecution) after the first --skip batches of each query.

usage: python3 bench/state_partitions.py [--rounds 2 --batches 40 --rate 1000]
Figures go to docs/benchmarks.md ("State partitions").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.taskmanager.runtime.spark_session import build_spark

COUNTS = (4, 16, 64)


def durations(spark, partitions: int, work: Path, *, rate: int, batches: int, skip: int) -> list[float]:
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    events = spark.readStream.format("rate").option("rowsPerSecond", rate).load()
    counts = events.groupBy((F.col("value") % 1000).alias("key")).agg(F.count("*").alias("n"))
    query = (
        counts.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(work / f"chk-{partitions}-{time.monotonic_ns()}"))
        .start()
    )
    try:
        seen: dict[int, float] = {}
        deadline = time.monotonic() + 600
        while len(seen) < batches + skip and time.monotonic() < deadline:
            for p in query.recentProgress:
                if p.batchId not in seen and p.numInputRows:
                    seen[p.batchId] = p.durationMs["triggerExecution"] / 1000
            time.sleep(0.2)
    finally:
        query.stop()
    return [seen[b] for b in sorted(seen)][skip:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--skip", type=int, default=5)
    ap.add_argument("--rate", type=int, default=1000)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hr-bench-partitions-"))
    spark = build_spark(2, work / "spark", shuffle_partitions=4)
    results: dict[int, list[float]] = {n: [] for n in COUNTS}
    try:
        for r in range(a.rounds):
            for n in COUNTS if r % 2 == 0 else reversed(COUNTS):
                got = durations(spark, n, work, rate=a.rate, batches=a.batches, skip=a.skip)
                results[n] += got
                print(
                    f"round {r + 1}, {n} partitions: median {statistics.median(got):.3f} s over {len(got)} batches",
                    flush=True,
                )
    finally:
        spark.stop()
    base = statistics.median(results[COUNTS[0]])
    for n in COUNTS:
        d = sorted(results[n])
        med, p90 = statistics.median(d), d[int(0.9 * (len(d) - 1))]
        print(
            f"{n:3d} partitions: median {med:.3f} s, p90 {p90:.3f} s per micro-batch ({med / base:.2f} x "
            f"{COUNTS[0]}), {len(d)} batches",
            flush=True,
        )
    print(f"loadavg {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
