"""The compose dev stack (deploy/docker-compose.yml over deploy/docker-compose.local.yml) driven
for tests and benchmarks: a copy of deploy/ with its own credentials (`headrace redis-auth deploy`,
services/cluster/compose_credentials.py), its own project name and free host ports, and the docker and
docker-compose commands against one engine (tests/docker_engine.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

from services.cluster.compose_credentials import compose_files
from shared.ports import free_port
from tests.docker_engine import DockerEngine

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
PORT_VARIABLES = (
    "HEADRACE_PUBLISH_DISPATCHER",
    "HEADRACE_PUBLISH_SPARK_UI",
    "HEADRACE_PUBLISH_PROMETHEUS",
    "HEADRACE_PUBLISH_FLOWER",
)
COMMAND_TIMEOUT_S = 300


class ComposeStack:
    def __init__(self, engine: DockerEngine, work: Path, project: str):
        self.engine, self.work, self.project = engine, work, project
        self.ports = {name: free_port() for name in PORT_VARIABLES}
        shutil.copytree(DEPLOY, work, ignore=shutil.ignore_patterns(".env", "secrets", "local-images", "images"))
        compose_files(work)  # passwords, the cluster secret, each TaskManager's keys
        with open(work / ".env", "a") as env:
            env.writelines(f"{name}={port}\n" for name, port in self.ports.items())

    @property
    def env(self) -> dict[str, str]:
        """docker-compose's environment: the engine's, with the stack's warm drivers warmed as
        deployed (the suite turns the warm-up off for its own clusters, tests/conftest.py; a
        driver of the stack's Spark cluster runs no query in reserve, only what needs no executor)."""
        return {**self.engine.env, "HEADRACE_WARM_UP_QUERY": "true"}

    @property
    def dispatcher_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['HEADRACE_PUBLISH_DISPATCHER']}"

    def docker(self, *args: str, timeout: float = COMMAND_TIMEOUT_S, check: bool = True) -> str:
        out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, env=self.engine.env)
        if check and out.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout

    def compose(self, *args: str, timeout: float = COMMAND_TIMEOUT_S, check: bool = True) -> str:
        cmd = [
            "docker-compose",
            "-p",
            self.project,
            "-f",
            str(self.work / "docker-compose.yml"),
            "-f",
            str(self.work / "docker-compose.local.yml"),
            *args,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env, cwd=self.work)
        if check and out.returncode != 0:
            raise RuntimeError(
                f"docker-compose {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()[-3000:]}"
            )
        return out.stdout

    def containers(self) -> dict[str, str]:
        """service -> container id, for every container of the project (running or not)."""
        out = self.docker(
            "ps",
            "-a",
            "--filter",
            f"label=com.docker.compose.project={self.project}",
            "--format",
            '{{.ID}} {{.Label "com.docker.compose.service"}}',
        )
        return {service: cid for cid, service in (line.split() for line in out.splitlines() if line.strip())}

    def health(self) -> dict[str, str]:
        """service -> its healthcheck's status (or the container's state while it has none)."""
        ids = list(self.containers().values())
        if not ids:
            return {}
        out = self.docker("inspect", *ids)
        return {
            c["Config"]["Labels"]["com.docker.compose.service"]: (c["State"].get("Health") or {}).get("Status")
            or c["State"]["Status"]
            for c in json.loads(out)
        }

    def wait_healthy(self, services: int, timeout_s: float) -> float:
        """Seconds until `services` containers all report healthy; TimeoutError naming the others."""
        t0 = time.monotonic()
        status: dict[str, str] = {}
        while time.monotonic() - t0 < timeout_s:
            status = self.health()
            if len(status) == services and all(s == "healthy" for s in status.values()):
                return time.monotonic() - t0
            time.sleep(1)
        late = {k: v for k, v in status.items() if v != "healthy"}
        raise TimeoutError(
            f"not healthy within {timeout_s:.0f} s: {late or 'no containers'} (of {len(status)}); "
            f"docker-compose -p {self.project} ps / logs <service>"
        )

    def up(self, services: int, timeout_s: float) -> float:
        """`up -d`, then every service healthy: seconds taken. Compose 1.29 gives up on a service
        whose dependency its healthcheck calls unhealthy (a JVM still starting on a loaded machine
        after start_period and its retries); such a dependency still gets healthy later, so `up`
        is run again, within the same bound."""
        t0 = time.monotonic()
        while True:
            try:
                self.compose("up", "-d", "--no-build", timeout=timeout_s)
                break
            except RuntimeError as exc:
                if "is unhealthy" not in str(exc) or time.monotonic() - t0 > timeout_s:
                    raise
                time.sleep(5)
        left = timeout_s - (time.monotonic() - t0)
        self.wait_healthy(services, max(left, 1))
        return time.monotonic() - t0

    def exec(self, service: str, *cmd: str, timeout: float = 120) -> str:
        return self.compose("exec", "-T", service, *cmd, timeout=timeout)

    def kill(self, service: str) -> None:
        self.docker("kill", self.containers()[service])

    def gateway(self) -> str:
        """The host's address on the project's network: how a container reaches servers outside the stack."""
        out = self.docker(
            "network", "inspect", f"{self.project}_default", "--format", "{{range .IPAM.Config}}{{.Gateway}}{{end}}"
        )
        return out.strip()

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={self.project}"
        return {
            "containers": self.docker("ps", "-aq", "--filter", label).split(),
            "networks": self.docker("network", "ls", "-q", "--filter", label).split(),
            "volumes": self.docker("volume", "ls", "-q", "--filter", label).split(),
        }

    def logs(self, tail: int = 40) -> str:
        return self.compose("logs", "--no-color", f"--tail={tail}", check=False, timeout=120)

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "20", timeout=600)
