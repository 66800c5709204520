"""Hostile input to the dispatcher, over real HTTP (uvicorn) and a PostgreSQL catalog: uploads far
above the limit are refused with 413 as they stream in, without being kept in memory or on disk;
a listing never parses stored files again; numbers that would overflow the catalog, strings it
refuses and job options a service cannot read answer 400 naming what is wrong, never 500."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from fastapi.testclient import TestClient

from services.dispatcher.app import create_app
from shared.catalog import Catalog
from shared.catalog.models import Artifact, Job
from shared.settings import Settings
from shared.streams import JM_STREAM
from shared.transport import InMemoryTransport
from tests.clusters import ServedApp

MB = 1024**2
LIMIT = 8 * MB  # this test's upload limit; the default (100 MB) is checked in the unit tests
PIPELINE = b"def build(ctx):\n    return None\n\n\ndef other(ctx):\n    return None\n"
BOUNDARY = "hostileboundary7MA4YWxkTrZu0gW"


class Live:
    """The dispatcher app on a free port in this process (so its memory is this process's)."""

    def __init__(self, tmp: Path, catalog_url: str, *, max_upload_bytes: int | None):
        self.settings = Settings(home=tmp / "home", catalog_url=catalog_url)
        self.catalog = Catalog(self.settings.catalog)
        self.catalog.migrate()
        self.transport = InMemoryTransport(sender="dispatcher")
        self.app = create_app(self.settings, self.catalog, self.transport, max_upload_bytes=max_upload_bytes)
        self.served = ServedApp(self.app)
        self.port, self.url = self.served.port, self.served.url

    def stop(self) -> None:
        self.served.stop()
        self.catalog.dispose()


@pytest.fixture
def live(tmp_path, migrated_pg_url):
    server = Live(tmp_path, migrated_pg_url, max_upload_bytes=LIMIT)
    yield server
    server.stop()


@pytest.fixture
def client(tmp_path, migrated_pg_url):
    settings = Settings(home=tmp_path / "home", catalog_url=migrated_pg_url)
    catalog = Catalog(settings.catalog)
    catalog.migrate()
    # A 500 must come back as a response here, not as an exception: that is what is tested.
    with TestClient(
        create_app(settings, catalog, InMemoryTransport(sender="dispatcher")), raise_server_exceptions=False
    ) as c:
        c.catalog, c.settings = catalog, settings
        yield c
    catalog.dispose()


def _multipart(size: int, name: str = "huge.py"):
    """A multipart body holding a `size`-byte .py file, generated as it is sent (1 MB at a time,
    the same buffer each time: the client keeps nothing either)."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="jarfile"; filename="{name}"\r\n'
        "Content-Type: text/x-python\r\n\r\n"
    ).encode()
    tail = f"\r\n--{BOUNDARY}--\r\n".encode()
    chunk = b"#" * MB

    def body():
        yield head
        for _ in range(size // MB):
            yield chunk
        yield b"#" * (size % MB)
        yield tail

    return body, len(head) + size + len(tail)


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _upload(client, name: str, data: bytes) -> str:
    r = client.post("/jars/upload", files={"jarfile": (name, data)})
    assert r.status_code == 200, r.text
    return r.json()["id"]


# --- uploads ---------------------------------------------------------------------------------


def test_a_200_mb_upload_is_refused_with_413_as_it_streams(live):
    body, length = _multipart(200 * MB)
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    before = _rss()
    with httpx.Client(base_url=live.url, timeout=120) as http:
        # Chunked (no length announced): stopped at the limit while it streams.
        t0 = time.monotonic()
        chunked = http.post("/jars/upload", content=body(), headers=headers)
        took = time.monotonic() - t0
        # With its length announced: refused before the parser sees a byte.
        announced = http.post("/jars/upload", content=body(), headers={**headers, "Content-Length": str(length)})
        flink = http.post("/v1/jars/upload", content=body(), headers={**headers, "Content-Length": str(length)})
    grew = _rss() - before
    for r in (chunked, announced):
        assert r.status_code == 413, r.text[:300]
        text = r.json()["errors"][0]
        assert "larger than the dispatcher's limit of 8 MB" in text, text
        assert r.json()["field"] == "jarfile" and "HEADRACE_MAX_UPLOAD_BYTES" in r.json()["hint"]
    assert "it is 200.0 MB" in announced.json()["errors"][0]
    assert flink.status_code == 413 and set(flink.json()) == {"errors"}  # Flink's shape under /v1/
    assert "HEADRACE_MAX_UPLOAD_BYTES" in flink.json()["errors"][0]
    assert grew < 64 * MB, f"the dispatcher's process grew by {grew / MB:.0f} MB during 600 MB of refused uploads"
    assert took < 60, f"refusing took {took:.1f} s"
    assert not live.settings.artifacts.exists() or not any(live.settings.artifacts.iterdir())
    assert httpx.get(f"{live.url}/jars").json()["files"] == []


def test_a_client_that_expects_100_continue_is_refused_before_it_sends_the_body(live):
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        sock.sendall(
            (
                f"POST /jars/upload HTTP/1.1\r\nHost: x\r\nContent-Length: {200 * MB}\r\n"
                f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
                "Expect: 100-continue\r\n\r\n"
            ).encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    status = answer.split(b"\r\n", 1)[0]
    assert status.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"100 Continue" not in answer


def test_the_limit_is_exact_for_the_file(client):
    limited = create_app(client.settings, client.catalog, InMemoryTransport(sender="d"), max_upload_bytes=MB)
    with TestClient(limited) as c:
        ok = c.post("/jars/upload", files={"jarfile": ("edge.py", b"#" * MB)})
        over = c.post("/jars/upload", files={"jarfile": ("over.py", b"#" * (MB + 1))})
    assert ok.status_code == 200, ok.text
    assert over.status_code == 413 and f"({MB + 1} bytes)" in over.json()["errors"][0], over.text


def test_a_json_body_above_its_limit_is_refused(client):
    jar = _upload(client, "job.py", PIPELINE)
    r = client.post(
        f"/jars/{jar}/run",
        content=b'{"config": {"x": "' + b"a" * (20 * MB) + b'"}}',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 413 and "limit for JSON requests" in r.json()["errors"][0], r.text[:300]


# --- listings ----------------------------------------------------------------------------------


def _listing_s(http) -> float:
    times = []
    for _ in range(3):
        t0 = time.monotonic()
        assert http.get("/jars").status_code == 200
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def test_a_listing_never_parses_the_stored_files(client):
    small = _upload(client, "small.py", PIPELINE)
    alone = _listing_s(client)
    # ~0.7 MB of code: parsing it takes about half a second; a 200 MB file took minutes.
    big_source = PIPELINE + "".join(f"x{i} = {i}\n" for i in range(50_000)).encode()
    big = _upload(client, "big.py", big_source)
    with_big = _listing_s(client)
    assert with_big < 3 * alone + 0.1, f"GET /jars took {with_big:.3f} s with a large artifact, {alone:.3f} s without"
    # What the listing shows is the catalog's: it stays the same with the stored files gone.
    shown = client.get("/jars").json()["files"]
    for artifact_id in (small, big):
        (client.settings.artifacts / artifact_id).unlink()
    assert client.get("/jars").json()["files"] == shown
    assert [e["name"] for e in shown[0]["entry"]] == ["build", "other"]
    # So does the entry check of a submission.
    r = client.post(f"/jars/{big}/run", json={"entryClass": "missing"})
    assert r.status_code == 400 and "build, other" in r.json()["hint"], r.text


def test_an_artifact_from_before_listings_gets_its_listing_once(client):
    jar = _upload(client, "old.py", PIPELINE)
    with client.catalog.session() as s:
        s.get(Artifact, jar).listing = None  # as a row written before migration 0004
    entries = client.get("/jars").json()["files"][0]["entry"]
    assert [e["name"] for e in entries] == ["build", "other"]
    with client.catalog.session() as s:
        assert s.get(Artifact, jar).listing["functions"] == ["build", "other"]
    (client.settings.artifacts / jar).unlink()
    assert client.get("/jars").json()["files"][0]["entry"] == entries


# --- numbers, strings and options -------------------------------------------------------------


@pytest.mark.parametrize(
    "body, params, field",
    [
        ({"parallelism": 2**63}, {}, "parallelism"),
        ({"parallelism": 2**63 - 1}, {}, "parallelism"),
        ({"parallelism": 2**31}, {}, "parallelism"),  # fits Python, overflows PostgreSQL's integer
        ({"parallelism": 2**64}, {}, "parallelism"),
        ({"parallelism": 0}, {}, "parallelism"),
        ({}, {"parallelism": str(2**63)}, "parallelism"),
        ({"restartStrategy": {"type": "fixed-delay", "attempts": 2**63}}, {}, "restartStrategy.attempts"),
        ({"restartStrategy": {"type": "exponential-delay", "max-backoff": 1e300}}, {}, "restartStrategy.max-backoff"),
        ({"jobName": "nul\x00byte"}, {}, "jobName"),
        ({"config": {"x": float("nan")}}, {}, "x"),
    ],
)
def test_values_the_catalog_cannot_store_answer_400(client, body, params, field):
    jar = _upload(client, "job.py", PIPELINE)
    r = client.post(
        f"/jars/{jar}/run", content=json.dumps(body), params=params, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400, r.text[:500]
    assert r.json()["field"] == field, r.json()
    with client.catalog.session() as s:
        assert s.query(Job).count() == 0


def test_rescaling_to_an_impossible_parallelism_answers_400(client):
    r = client.patch("/jobs/0123456789abcdef0123456789abcdef/rescaling", params={"parallelism": 2**63})
    assert r.status_code == 400 and r.json()["field"] == "parallelism", r.text


def test_a_noop_duration_that_is_not_a_duration_answers_400(client):
    jar = _upload(client, "job.py", PIPELINE)
    r = client.post(f"/jars/{jar}/run", json={"kind": "noop", "config": {"noop.duration": "abc"}})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["field"] == "noop.duration"
    message = body["errors"][0]
    assert message.startswith("noop.duration: must be ") and "got 'abc'" in message
    assert 'for example {"noop.duration": 2.5}' in message
    # Flink's clients send options as flinkConfiguration, with string values.
    r = client.post(
        f"/v1/jars/{jar}/run",
        json={
            "kind": "noop",
            "flinkConfiguration": {
                "headrace.task.startup-timeout": "soon",
                "restart-strategy.type": "fixed-delay",
                "restart-strategy.fixed-delay.attempts": "many",
            },
        },
    )
    assert r.status_code == 400 and set(r.json()) == {"errors"}
    assert [m.split(":", 1)[0] for m in r.json()["errors"]] == [
        "headrace.task.startup-timeout",
        "restart-strategy.fixed-delay.attempts",
    ]
    with client.catalog.session() as s:
        assert s.query(Job).count() == 0


def test_flink_restart_options_are_used_when_the_request_names_no_strategy(client):
    jar = _upload(client, "job.py", PIPELINE)
    r = client.post(
        f"/jars/{jar}/run",
        json={
            "kind": "noop",
            "flinkConfiguration": {
                "restart-strategy.type": "fixed-delay",
                "restart-strategy.fixed-delay.attempts": "5",
                "restart-strategy.fixed-delay.delay": "2 s",
            },
        },
    )
    assert r.status_code == 200, r.text
    assert client.get(f"/jobs/{r.json()['jobid']}").json()["restart-strategy"] == {
        "type": "fixed-delay",
        "attempts": 5,
        "delay": 2.0,
    }


def test_an_upload_name_the_catalog_would_refuse_is_cleaned(client):
    r = client.post("/jars/upload", files={"jarfile": ("x" * 400 + "\x01.py", PIPELINE)})
    assert r.status_code == 200, r.text
    name = client.get("/jars").json()["files"][0]["name"]
    assert len(name) == 255 and name.endswith(".py") and "\x01" not in name


def test_the_cli_prints_the_400_for_an_impossible_parallelism(live, tmp_path):
    pipeline = tmp_path / "job.py"
    pipeline.write_bytes(PIPELINE)
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "run", str(pipeline), "-p", str(2**63), "-m", live.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "400" in result.stderr and "parallelism: must be an integer between 1 and 2147483647" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not [b for b in live.transport.bodies(JM_STREAM)]
