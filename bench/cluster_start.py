"""Cluster start: `headrace up` -> ready with its TaskManagers and their warm drivers.

Each run starts `headrace up` (a fresh HEADRACE_HOME, a free dispatcher port, the defaults: its own
redis-server, SQLite catalog, one JobManager, one ResourceManager, 2 TaskManagers with one warm
driver each, the dispatcher) and times, from the command's start:
  up     the command prints "Headrace is up" (every TaskManager registered, the dispatcher answers)
  warm   every TaskManager reports a warm driver ready (hr:tm:<id>:warm in the cluster's Redis),
         so a submission would start at once
then stops it with SIGINT (as Ctrl-C does) and waits for it to exit.

usage: python bench/cluster_start.py [--runs 3] [--concurrency 1,2] [--warm-up-query true,false] [--profile] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import code_dir, free_port, stop_group
from bench.checkpoint_overhead import machine
from shared import streams


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (user, nice, system, irq, softirq):
    the difference over a start is what every process of it used, on a machine otherwise idle."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return sum(int(f) for f in fields[:3] + fields[5:7]) / os.sysconf("SC_CLK_TCK")


def _stat(path: Path) -> tuple[int, float] | None:
    """(parent pid, CPU seconds used so far) of a process or thread, from its stat file."""
    try:
        fields = path.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _kind(pid: int) -> str:
    """What a process of the cluster is, named as docs/benchmarks.md names it."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "gone"
    text = b" ".join(cmd).decode(errors="replace")
    if comm == "java":
        return "driver JVM"
    if "redis-server" in text:
        return "redis-server"
    for marker, kind in (
        ("pyspark.daemon", "Spark Python daemons and workers"),
        ("python_forkserver", "Python fork servers"),
        ("runtime.runner", "Python drivers"),
        ("python_streaming_source_runner", "Spark Python daemons and workers"),
        ("pyspark", "Spark Python daemons and workers"),
    ):
        if marker in text:
            return kind
    return "services (headrace up and its five processes)"


def cpu_profile(root: int) -> dict[str, float]:
    """CPU seconds used so far by every living process below `root`, by kind; a JVM's compiler
    threads apart. Forked children (a daemon's workers) count under their parent's kind."""
    parents, cpu = {}, {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and (st := _stat(proc / "stat")) is not None:
            parents[int(proc.name)], cpu[int(proc.name)] = st
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += [c for c, p in parents.items() if p == pid]
    out: dict[str, float] = {}
    for pid in tree:
        kind = _kind(pid)
        if kind == "Python fork servers" and parents.get(pid) in tree and _kind(parents[pid]) == kind:
            kind = "Spark Python daemons and workers"  # a process the fork server forked for Spark
        out[kind] = out.get(kind, 0.0) + cpu[pid]
        if kind == "driver JVM":
            try:
                threads = list(Path(f"/proc/{pid}/task").iterdir())
            except OSError:
                threads = []  # the JVM exited since the scan
            for thread in threads:
                try:
                    name = (thread / "comm").read_text().strip()
                except OSError:
                    continue  # a thread that ended since the listing
                if name.startswith(("C2 CompilerThre", "C1 CompilerThre")):
                    key = f"  of which {name[:2]} compiler"
                    out[key] = out.get(key, 0.0) + (_stat(thread / "stat") or (0, 0.0))[1]
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def one_start(
    timeout_s: float, taskmanagers: int = 2, concurrency: str = "", warm_up_query: str = "", profile: bool = False
) -> dict:
    home = Path(tempfile.mkdtemp(prefix="hr-start-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    env |= {"HEADRACE_HOME": str(home), "HEADRACE_DISPATCHER_PORT": str(free_port())}
    if concurrency:
        env["HEADRACE_WARMUP_CONCURRENCY"] = concurrency
    if warm_up_query:
        env["HEADRACE_WARM_UP_QUERY"] = warm_up_query
    out = home / "up.log"
    t0, cpu0 = time.monotonic(), busy_cpu_s()
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "up", "-n", str(taskmanagers)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=code_dir(),
        )
    up = warm = cpu = None
    client = None
    try:
        deadline = t0 + timeout_s
        while warm is None:
            now = time.monotonic()
            if now > deadline:
                raise SystemExit(f"not ready with warm drivers after {timeout_s:.0f} s; see {out}")
            if proc.poll() is not None:
                raise SystemExit(f"headrace up exited with {proc.returncode}; see {out}")
            if up is None and b"Headrace is up" in out.read_bytes():
                up = now - t0
            if client is None:
                config = next(iter(home.glob("runs/*/config.yaml")), None)
                if config is not None:
                    client = redis.Redis.from_url(yaml.safe_load(config.read_text())["redis_url"])
            if client is not None:
                try:
                    ready = [
                        json.loads(client.get(streams.tm_warm_key(f"tm-{i + 1}")) or "{}").get("ready", 0)
                        for i in range(taskmanagers)
                    ]
                except (redis.RedisError, ValueError):
                    ready = []
                if ready and all(r >= 1 for r in ready) and up is not None:
                    warm, cpu = now - t0, busy_cpu_s() - cpu0
                    if profile:
                        print(f"  CPU-s by process at ready: {cpu_profile(proc.pid)}", flush=True)
            time.sleep(0.05)
    finally:
        stop_group(proc, signal.SIGINT)  # as Ctrl-C does
        if client is not None:
            client.close()
    return {"up_s": round(up, 2), "warm_s": round(warm, 2), "cpu_s": round(cpu, 1)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--timeout", type=float, default=180)
    p.add_argument(
        "--concurrency",
        default="",
        help="comma-separated HEADRACE_WARMUP_CONCURRENCY values to alternate (default: the default)",
    )
    p.add_argument(
        "--warm-up-query",
        default="",
        help="comma-separated HEADRACE_WARM_UP_QUERY values to alternate (default: the default)",
    )
    p.add_argument("--smoke", action="store_true", help="one run: checks the benchmark still works")
    p.add_argument("--profile", action="store_true", help="print CPU-s by process kind at ready")
    args = p.parse_args()
    if args.smoke:
        args.runs = 1
    print(f"machine: {machine()}", flush=True)
    variants = [
        (c, q)
        for c in (args.concurrency.split(",") if args.concurrency else [""])
        for q in (args.warm_up_query.split(",") if args.warm_up_query else [""])
    ]
    runs: dict[tuple[str, str], list[dict]] = {v: [] for v in variants}

    def label(v: tuple[str, str]) -> str:
        return f"warm-up concurrency {v[0] or 'default'}, warm-up query {v[1] or 'default'}"

    for i in range(args.runs):
        for v in variants:
            load = round(os.getloadavg()[0], 2)
            r = one_start(args.timeout, concurrency=v[0], warm_up_query=v[1], profile=args.profile)
            runs[v].append(r)
            print(
                f"run {i + 1} ({label(v)}): up after {r['up_s']:.2f} s, "
                f"warm drivers ready after {r['warm_s']:.2f} s, machine busy {r['cpu_s']:.1f} CPU-s until then "
                f"(load {load})",
                flush=True,
            )
            time.sleep(3)
    for v, rs in runs.items():
        print(
            f"median ({label(v)}): up {statistics.median(r['up_s'] for r in rs):.2f} s, "
            f"warm {statistics.median(r['warm_s'] for r in rs):.2f} s, "
            f"machine busy {statistics.median(r['cpu_s'] for r in rs):.1f} CPU-s"
        )


if __name__ == "__main__":
    main()
