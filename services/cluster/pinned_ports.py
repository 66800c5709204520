"""Which ports `headrace up` fixes instead of choosing free ones (--redis-port, --zookeeper-port,
--metrics-port-base), checked against what the cluster will actually start."""

from __future__ import annotations

from dataclasses import dataclass

from services.cluster import redis_auth
from services.cluster.infrastructure import ClusterError
from shared.settings import Settings


# Which Redis user each child connects as (its config file is <run>/<role>.yaml).
def role_of(name: str) -> str | None:
    for role in (*redis_auth.SERVICES, redis_auth.TASKMANAGER):
        if name == role or name.startswith(f"{role}-"):
            return role
    return None


@dataclass(frozen=True)
class PinnedPorts:
    settings: Settings
    planned: tuple[str, ...]  # the children the cluster will start, in order
    redis_port: int | None = None
    zookeeper_port: int | None = None
    metrics_port_base: int | None = None

    def all(self) -> dict[str, int]:
        """The ports fixed instead of chosen free, by what will listen there."""
        if self.redis_port and "redis" not in self.planned:
            raise ClusterError(
                "--redis-port pins the Redis headrace up starts; with HEADRACE_REDIS_URL set it "
                "starts none (that URL names the port)"
            )
        if self.zookeeper_port and "zookeeper" not in self.planned:
            raise ClusterError(
                "--zookeeper-port pins the ZooKeeper headrace up starts with --ha; without --ha, "
                "or with HEADRACE_ZOOKEEPER_QUORUM set, it starts none"
            )
        ports = {"redis (--redis-port)": self.redis_port, "zookeeper (--zookeeper-port)": self.zookeeper_port}
        ports |= {f"{name}'s metrics (--metrics-port-base)": port for name, port in self.metrics().items()}
        return {what: port for what, port in ports.items() if port}

    def metrics(self) -> dict[str, int]:
        """With `metrics_port_base`: the ResourceManager's metrics port is the base, then each
        JobManager's, then each TaskManager's, in order (metrics turned off take no port)."""
        if not self.metrics_port_base:
            return {}
        names = [n for n in self.planned if getattr(self.settings, f"{role_of(n)}_metrics_port", -1) != -1]
        return {name: self.metrics_port_base + i for i, name in enumerate(names)}
