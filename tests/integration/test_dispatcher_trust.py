"""Issue 21 against a real dispatcher process (`python -m services.dispatcher`, auth required, a
PostgreSQL catalog, a throwaway redis-server), probed as a hostile client would: a zip bomb and
a lying zip, a module too large to parse, trickling and stalled connections, an unauthenticated
upload that never sends its body, and submissions that used to pass their checks and fail later
(finding 10). Each refusal names what is wrong; nothing is half-stored and nothing is submitted."""

from __future__ import annotations

import io
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import httpx
import pytest
import yaml

from shared.catalog import Catalog, tokens
from shared.ports import free_port
from tests.servers import RedisServer
from tests.waiting import wait_for

MB = 1024**2
HEADER_S, IDLE_S, TOTAL_S = 2.0, 1.5, 4.0
PIPELINE = b"import os\n\n\ndef build(ctx):\n    return None\n\n\nclass Helper:\n    pass\n"


class Dispatcher:
    def __init__(self, tmp: Path, catalog_url: str):
        self.redis = RedisServer(tmp)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.home = tmp / "home"
        catalog = Catalog(catalog_url)
        catalog.migrate()
        with catalog.session() as s:
            self.token = tokens.create(s, "admin", "trust-test")[1]
        catalog.dispose()
        self.env = {
            **os.environ,
            "HEADRACE_HOME": str(self.home),
            "HEADRACE_CATALOG_URL": catalog_url,
            "HEADRACE_REDIS_URL": self.redis.url,
            "HEADRACE_DISPATCHER_PORT": str(self.port),
            "HEADRACE_AUTH": "required",
            "HEADRACE_MAX_ARTIFACT_MEMBERS": "50",
            "HEADRACE_REQUEST_HEADER_TIMEOUT_S": str(HEADER_S),
            "HEADRACE_REQUEST_BODY_IDLE_TIMEOUT_S": str(IDLE_S),
            "HEADRACE_REQUEST_BODY_TIMEOUT_S": str(TOTAL_S),
        }
        self.env.pop("HEADRACE_CONFIG", None)
        self.log = open(tmp / "dispatcher.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.dispatcher"],
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.http = httpx.Client(base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {self.token}"})

        def healthy() -> bool:
            try:
                if self.http.get("/healthz").status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, (tmp / "dispatcher.log").read_text()
            return False

        wait_for("the dispatcher answering /healthz", healthy, 60, poll_s=0.2)

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stop(self) -> None:
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)
        self.log.close()
        self.redis.stop()


@pytest.fixture(scope="module")
def live(tmp_path_factory, pg_url_module):
    server = Dispatcher(tmp_path_factory.mktemp("trust"), pg_url_module)
    yield server
    server.stop()


def _upload(live, name: str, data: bytes) -> httpx.Response:
    return live.http.post("/jars/upload", files={"jarfile": (name, data)})


def _stored(live) -> list[str]:
    artifacts = live.home / "artifacts"
    return sorted(p.name for p in artifacts.iterdir()) if artifacts.is_dir() else []


def _bomb(size: int) -> bytes:
    """A zip whose one .py member unpacks to `size` bytes, written in chunks (never held whole)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("pipeline.py", "w", force_zip64=True) as member:
            chunk = b"#" * MB
            for _ in range(size // MB):
                member.write(chunk)
    return buf.getvalue()


def _overview_s(live) -> float:
    t0 = time.monotonic()
    assert live.http.get("/jobs/overview").status_code == 200
    return time.monotonic() - t0


def test_a_zip_bomb_is_refused_by_its_directory_and_the_dispatcher_stays_small(live):
    bomb = _bomb(300 * MB)
    assert len(bomb) < 2 * MB
    before, stored = live.rss(), _stored(live)
    r = _upload(live, "bomb.zip", bomb)
    assert r.status_code == 413, r.text
    body = r.json()
    assert body["field"] == "jarfile" and body["setting"] in (
        "max_artifact_uncompressed_bytes",
        "max_artifact_source_bytes",
    ), body
    assert body["limit"] > 0 and "HEADRACE_MAX_ARTIFACT" in body["errors"][0]
    assert live.rss() - before < 60 * MB, (before, live.rss())
    assert _overview_s(live) < 1.0
    assert _stored(live) == stored  # no file left, not even the temporary copy


def _lying_zip(real: int, declared: int) -> bytes:
    """A zip whose headers claim its member unpacks to `declared` bytes; it unpacks to `real`."""
    data = bytearray(_bomb(real))
    for sig, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # local header, central directory
        at = data.find(sig)
        data[at + offset : at + offset + 4] = struct.pack("<I", declared)
    return bytes(data)


def test_a_zip_that_lies_about_its_sizes_is_refused_as_it_unpacks(live):
    before = live.rss()
    r = _upload(live, "liar.zip", _lying_zip(64 * MB, 1000))
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "jarfile" and "pipeline.py" in r.json()["errors"][0]
    assert live.rss() - before < 60 * MB


def test_too_many_members_and_a_module_too_large_to_parse_are_413(live):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(60):
            zf.writestr(f"pkg/m{i}.py", "x = 1\n")
    r = _upload(live, "many.zip", buf.getvalue())
    assert r.status_code == 413 and r.json()["setting"] == "max_artifact_members" and r.json()["limit"] == 50
    before = live.rss()
    big = b"def build(ctx):\n    return None\n" + b"x = 1\n" * (11 * MB // 6)
    r = _upload(live, "big.py", big)
    assert r.status_code == 413, r.text
    assert r.json()["setting"] == "max_artifact_source_bytes" and "10 MB" in r.json()["errors"][0]
    assert live.rss() - before < 60 * MB


def _raw(live, head: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=TOTAL_S + 10)
    sock.sendall(head)
    return sock


def _answer_and_close(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed (monotonic)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic()


def _upload_head(live, length: int, token: str | None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST /jars/upload HTTP/1.1\r\nHost: 127.0.0.1:{live.port}\r\n{auth}"
        f"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def test_a_stalled_body_gets_408_and_the_connection_closes(live):
    sock = _raw(live, _upload_head(live, 10_000, live.token) + b"--x\r\n")
    t0 = time.monotonic()
    data, closed = _answer_and_close(sock)
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"request_body_idle_timeout_s" in data
    assert IDLE_S - 0.2 <= closed - t0 < IDLE_S + 2


def test_thirty_trickling_uploads_all_end_within_the_total_bound(live):
    results: list[tuple[bytes, float]] = []
    start = time.monotonic()

    def trickle() -> None:
        part = b'--x\r\nContent-Disposition: form-data; name="jarfile"; filename="slow.py"\r\n\r\n'
        sock = _raw(live, _upload_head(live, 10_000, live.token) + part)
        data = b""
        try:
            while time.monotonic() - start < TOTAL_S + 10:
                # Read whatever came before sending more: a byte sent after the server closed
                # would be answered with a reset, which may drop the unread answer.
                readable, _, _ = select.select([sock], [], [], 1.0)  # one byte a second: never idle long
                if readable:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                    continue
                sock.sendall(b"#")
        except OSError:
            pass
        finally:
            sock.close()
        results.append((data, time.monotonic()))

    threads = [threading.Thread(target=trickle) for _ in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TOTAL_S + 20)
    assert len(results) == 30
    assert all(d.startswith(b"HTTP/1.1 408") and b"request_body_timeout_s" in d for d, _ in results), {
        d[:80] for d, _ in results
    }
    assert max(end for _, end in results) - start < TOTAL_S + 4
    assert _overview_s(live) < 1.0


def test_headers_that_never_complete_get_408(live):
    t0 = time.monotonic()
    sock = _raw(live, b"POST /jars/upload HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    data, closed = _answer_and_close(sock)
    assert data.startswith(b"HTTP/1.1 408") and b"request_header_timeout_s" in data, data
    assert HEADER_S - 0.2 <= closed - t0 < HEADER_S + 2
    silent = socket.create_connection(("127.0.0.1", live.port), timeout=HEADER_S + 10)
    data, closed = _answer_and_close(silent)
    assert data.startswith(b"HTTP/1.1 408") and closed - t0 < 2 * HEADER_S + 2


def test_an_unauthenticated_upload_is_refused_before_its_body_is_sent(live):
    stored = _stored(live)
    sock = _raw(live, _upload_head(live, 50 * MB, None))  # headers only: the body is never sent
    t0 = time.monotonic()
    sock.settimeout(1.0)
    first = b""
    while b"authentication required" not in first:  # the answer, headers and JSON, without a body sent
        first += sock.recv(65536)
    assert time.monotonic() - t0 < 1.0
    assert first.startswith(b"HTTP/1.1 401"), first[:200]
    sock.settimeout(10)
    rest, closed = _answer_and_close(sock)  # closed after a short drain of a body that never comes
    assert closed - t0 < 5
    assert _stored(live) == stored


def _run(live, jar: str, **body) -> httpx.Response:
    return live.http.post(f"/jars/{jar}/run", json=body)


def test_submission_checks_refuse_what_would_fail_later(live):
    jar = _upload(live, "job.py", PIPELINE).json()["id"]
    jobs_before = live.http.get("/jobs/overview").json()["jobs"]
    cases = [
        ({"entryClass": "os.system"}, "entryClass"),
        ({"entryClass": "os"}, "entryClass"),
        ({"entryClass": "Helper"}, "entryClass"),
        ({"entryClass": "missing"}, "entryClass"),
        ({"flinkConfiguration": {"state.checkpoints.dir": "/etc"}}, "state.checkpoints.dir"),
        ({"config": {"execution.checkpointing.dir": "file:///tmp/elsewhere"}}, "execution.checkpointing.dir"),
        ({"allowNonRestoredState": "yes"}, "allowNonRestoredState"),
        ({"allowNonRestoredState": 1}, "allowNonRestoredState"),
    ]
    for body, field in cases:
        r = _run(live, jar, **body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["field"] == field, (body, r.json())
    r = live.http.post(f"/jars/{jar}/run", params={"allowNonRestoredState": "yes"}, json={"kind": "noop"})
    assert r.status_code == 400 and r.json()["field"] == "allowNonRestoredState", r.text
    job = "0" * 32
    r = live.http.post(f"/jobs/{job}/savepoints", json={"cancel-job": "yes"})
    assert r.status_code == 400 and r.json()["field"] == "cancel-job", r.text
    r = live.http.post(f"/jobs/{job}/stop", json={"drain": "on"})
    assert r.status_code == 400 and r.json()["field"] == "drain", r.text
    r = live.http.post("/jobs/schedules", json={"jarId": jar, "everySeconds": 60, "enabled": "no"})
    assert r.status_code == 400 and r.json()["field"] == "enabled", r.text
    assert live.http.get("/jobs/overview").json()["jobs"] == jobs_before  # nothing was submitted
    # The spellings Flink's own clients send still work.
    assert _run(live, jar, allowNonRestoredState="false", kind="noop").status_code == 200
    cluster_dir = str(live.home / "checkpoints")
    assert _run(live, jar, kind="noop", flinkConfiguration={"state.checkpoints.dir": cluster_dir}).status_code == 200


def test_a_long_upload_name_keeps_its_extension(live):
    r = _upload(live, "a" * 300 + ".py", PIPELINE)
    assert r.status_code == 200, r.text
    assert r.json()["filename"].endswith(".py") and Path(r.json()["filename"]).is_file()
    assert _run(live, r.json()["id"]).status_code == 200


def test_headrace_list_finds_the_dispatcher_on_the_configured_port(live, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"dispatcher_port": live.port}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    env.update(HEADRACE_CONFIG=str(config), HEADRACE_TOKEN=live.token)
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip(), out  # a job line per job, or "No jobs."
    env.pop("HEADRACE_TOKEN")
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1 and "401" in out.stderr and "authentication required" in out.stderr, out.stderr
