"""The autoscaler against fixed parallelisms, side by side: three deployments of the same slow
counting pipeline (tests/e2e/slow_counts.py: a fixed cost per event, paid where the stream is
read, so one unit of parallelism processes 1000 / cost-ms events per second) on one cluster,
each fed by its own outside producer on the same schedule:

  autoscaled   autoscaler min 1, max 2 (window and stabilization from the options)
  fixed-1      parallelism 1
  fixed-2      parallelism 2

  steady       --low events/s until the autoscaled one has evaluated and kept 1
  rise         --high events/s for --phase s (above one unit, below two): the autoscaler's
               decision, its job RUNNING at 2, when each deployment had caught up again (its sink
               within 2 s of input of what was produced), and how far behind each ended
  fall         --low again for --phase s: the autoscaler's return to 1
  backlog      --backlog events written at once into each stream (at --low besides), for
               --backlog-phase s: the decision, and when each deployment had drained it

Every evaluation that rescaled is printed (the decision log). usage:
  python3 bench/autoscaler.py [--cost-ms 0.2 --low 500 --high 7000 --backlog 500000]
Figures go to docs/benchmarks.md ("The autoscaler").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.checkpoint_overhead import drop_pg, fresh_pg
from tests.clusters import Rest, start_cluster
from tests.e2e.counting import Producer, wait_for

ROOT = Path(__file__).resolve().parent.parent
ADMIN_URL = os.environ.get("HEADRACE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
NAMES = ("autoscaled", "fixed-1", "fixed-2")
CAUGHT_UP_S = 2.0  # a deployment has caught up when its sink is within this much input of the producer


class Deployment:
    def __init__(self, name: str, rest: Rest, cluster, sink_url: str, jar: str, a: argparse.Namespace):
        self.name, self.rest, self.sink_url = name, rest, sink_url
        self.stream, self.table = f"bench-{name}", f"bench_{name.replace('-', '_')}"
        self.producer = Producer(cluster.redis_url, self.stream, rate=a.low).start()
        self.extra = 0  # backlog events written besides the producer's
        spec = {
            "jarId": jar,
            "parallelism": 2 if name == "fixed-2" else 1,
            "programArgsList": [
                "--stream",
                self.stream,
                "--table",
                self.table,
                "--sink-url",
                sink_url,
                "--cost-ms",
                str(a.cost_ms),
            ],
            "flinkConfiguration": {"execution.checkpointing.interval": "5 s"},
            "restartStrategy": {"type": "fixed-delay", "attempts": 10, "delay": "1 s"},
            "rollback": {"readyWithin": "120 s"},
        }
        if name == "autoscaled":
            spec["autoscaler"] = {
                "enabled": True,
                "minParallelism": 1,
                "maxParallelism": 2,
                "metricsWindow": f"{a.window} s",
                "stabilization": f"{a.stabilization} s",
                "catchUp": f"{a.catch_up} s",
            }
        r = rest.http.put(f"/deployments/{name}", json=spec, timeout=300)
        assert r.status_code == 200, r.text

    def status(self) -> dict:
        return self.rest.get(f"/deployments/{self.name}")["status"]

    def running_parallelism(self) -> int | None:
        st = self.status()
        if st["lifecycleState"] != "STABLE" or not st["jobId"]:
            return None
        return self.rest.job(st["jobId"])["vertices"][0]["parallelism"]

    def counted(self) -> int:
        with psycopg.connect(self.sink_url) as c:
            try:
                return int(c.execute(f"SELECT coalesce(sum(count), 0) FROM {self.table}").fetchone()[0])
            except psycopg.errors.UndefinedTable:
                return 0

    def produced(self) -> int:
        return self.producer.produced + self.extra

    def behind(self) -> int:
        return self.produced() - self.counted()

    def write_backlog(self, url: str, n: int) -> None:
        client = redis.Redis.from_url(url)
        base = 10**9  # numbers apart from the producer's
        for start in range(0, n, 10_000):
            pipe = client.pipeline(transaction=False)
            for k in range(start, min(n, start + 10_000)):
                pipe.xadd(self.stream, {"json": json.dumps(self.producer.event(base + k))})
            pipe.execute()
        self.extra += n
        client.close()


def follow(deps: dict[str, Deployment], t0: float, rate: float, *, decided_at: int, seconds: float) -> dict:
    """For `seconds` from t0: when the autoscaled one decided (status.parallelism == decided_at) and
    ran at it, when each deployment had caught up (after it first fell behind, if it did), and
    how far behind each was at the end (events)."""
    marks: dict[str, float] = {}
    fell_behind = {n: False for n in deps}
    auto = deps["autoscaled"]
    while (now := time.monotonic() - t0) < seconds:
        if "decision" not in marks and auto.status()["parallelism"] == decided_at:
            marks["decision"] = now
        if "decision" in marks and "running" not in marks and auto.running_parallelism() == decided_at:
            marks["running"] = now
        for name, d in deps.items():
            key = f"{name} caught up"
            if key in marks:
                continue
            behind = d.behind()
            if behind > max(rate, 1) * CAUGHT_UP_S * 3:
                fell_behind[name] = True
            elif behind <= max(rate, 1) * CAUGHT_UP_S and fell_behind[name]:
                marks[key] = now
        time.sleep(0.5)
    out: dict = {k: round(v, 1) for k, v in marks.items()}
    out["behind at the end"] = {name: d.behind() for name, d in deps.items()}
    return out


def decision_log(rest: Rest) -> list[str]:
    evaluations = rest.get("/deployments/autoscaled/autoscaler?limit=2000")["evaluations"]
    return [
        f"{e['outcome']} {e['parallelism']}->{e['proposed']}: {e['reason']}"
        for e in evaluations
        if e["outcome"] in ("scale-up", "scale-down", "held")
    ]


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--cost-ms", type=float, default=0.2)
    ap.add_argument("--low", type=float, default=500)
    ap.add_argument("--high", type=float, default=7000)
    ap.add_argument("--backlog", type=int, default=500_000)
    ap.add_argument("--window", type=float, default=20)
    ap.add_argument("--stabilization", type=float, default=30)
    ap.add_argument("--catch-up", type=float, default=120)
    ap.add_argument("--phase", type=float, default=180, help="seconds of the rise and of the fall")
    ap.add_argument("--backlog-phase", type=float, default=300, help="seconds given to drain the backlog")
    a = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="hr-bench-autoscaler-"))
    catalog_url, sink_url = fresh_pg(ADMIN_URL), fresh_pg(ADMIN_URL)
    cluster = start_cluster(home, catalog_url=catalog_url, taskmanagers=3, slots=2, warm_drivers=1)
    deps: dict[str, Deployment] = {}
    try:
        rest = Rest(cluster.dispatcher_url)
        jar = rest.upload(ROOT / "tests" / "e2e" / "slow_counts.py")
        for name in NAMES:
            deps[name] = Deployment(name, rest, cluster, sink_url, jar, a)
        wait_for(lambda: all(d.running_parallelism() for d in deps.values()), 600, "all three STABLE")
        wait_for(
            lambda: any(e["outcome"] == "keep" for e in rest.get("/deployments/autoscaled/autoscaler")["evaluations"]),
            300,
            "the autoscaler to evaluate",
        )
        print(f"steady at {a.low:g}/s: autoscaled at {deps['autoscaled'].running_parallelism()}", flush=True)

        t0 = time.monotonic()
        for d in deps.values():
            d.producer.set_rate(a.high)
        rise = follow(deps, t0, a.high, decided_at=2, seconds=a.phase)
        print(f"rise to {a.high:g}/s: {rise}", flush=True)

        t0 = time.monotonic()
        for d in deps.values():
            d.producer.set_rate(a.low)
        fall = follow(deps, t0, a.low, decided_at=1, seconds=a.phase)
        print(f"fall to {a.low:g}/s: {fall}", flush=True)

        t0 = time.monotonic()
        for d in deps.values():
            d.write_backlog(cluster.redis_url, a.backlog)
        written_s = time.monotonic() - t0
        backlog = follow(deps, t0, a.low, decided_at=2, seconds=a.backlog_phase)
        print(f"backlog of {a.backlog} (written in {written_s:.1f} s): {backlog}", flush=True)
        print("decision log:", *decision_log(rest), sep="\n  ", flush=True)
        print(f"loadavg {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        for d in deps.values():
            d.producer.stop()
        cluster.stop()
        drop_pg(ADMIN_URL, catalog_url)
        drop_pg(ADMIN_URL, sink_url)


if __name__ == "__main__":
    main()
