"""`headrace up --ha`'s catalog (services/cluster/catalog_server.py) without starting anything: it
runs a PostgreSQL server of its own unless a catalog URL is configured, refuses an SQLite one
before anything starts, keeps the password in a 0600 passfile that the URL names (so no URL holds
it), and finds Debian's newest server binaries."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from services.cluster import catalog_server
from services.cluster.infrastructure import ClusterError
from services.cluster.local_cluster import SQLITE_WITH_HA, LocalCluster
from shared.settings import Settings


def cluster(tmp_path: Path, *, ha: bool, **settings) -> LocalCluster:
    return LocalCluster(Settings(home=tmp_path, **settings), ha=ha, jobmanagers=2 if ha else 1)


def test_ha_without_a_catalog_url_runs_its_own_postgresql(tmp_path):
    assert "postgres" in cluster(tmp_path, ha=True).planned_children()
    assert "postgres" not in cluster(tmp_path, ha=False).planned_children()
    configured = cluster(tmp_path, ha=True, catalog_url="postgresql://u@db.example:5432/c")
    assert "postgres" not in configured.planned_children() and not configured.runs_catalog_server


def test_ha_refuses_an_sqlite_catalog_the_user_configured_before_anything_starts(tmp_path):
    c = cluster(tmp_path, ha=True, catalog_url=f"sqlite:///{tmp_path / 'catalog.db'}")
    with pytest.raises(ClusterError) as refused:
        c.start()
    assert str(refused.value) == SQLITE_WITH_HA and "\n" not in SQLITE_WITH_HA
    assert "paused JobManager" in SQLITE_WITH_HA and "PostgreSQL" in SQLITE_WITH_HA
    assert c.children == [] and c.run_dir is None


def test_the_password_stays_in_its_passfile(tmp_path):
    passfile = tmp_path / "pgpass"
    password = catalog_server._password(passfile)
    assert stat.S_IMODE(passfile.stat().st_mode) == 0o600
    assert passfile.read_text() == f"127.0.0.1:*:*:headrace:{password}\n"
    assert catalog_server._password(passfile) == password  # kept from one run to the next
    server = catalog_server.CatalogServer(
        data_dir=tmp_path / "data",
        passfile=passfile,
        port=5999,
        binaries=Path("/usr/lib/postgresql/15/bin"),
        os_user="postgres",
    )
    assert server.url == f"postgresql://headrace@127.0.0.1:5999/headrace?passfile={passfile}"
    assert password not in server.url and password not in " ".join(server.command())
    cmd = server.command()
    assert cmd[:5] == ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]
    assert "listen_addresses=127.0.0.1" in cmd and "unix_socket_directories=" in cmd


def test_debians_newest_server_binaries_are_used(tmp_path, monkeypatch):
    for version in ("9.6", "15", "13"):
        bin_dir = tmp_path / version / "bin"
        bin_dir.mkdir(parents=True)
        for name in ("postgres", "initdb"):
            (bin_dir / name).touch()
    monkeypatch.setattr(catalog_server, "DEBIAN_BINARIES", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert catalog_server.binaries_dir() == tmp_path / "15" / "bin"
    monkeypatch.setattr(catalog_server, "DEBIAN_BINARIES", tmp_path / "none")
    with pytest.raises(ClusterError, match="apt-get install postgresql"):
        catalog_server.binaries_dir()


@pytest.mark.skipif(os.geteuid() == 0, reason="as root the server runs as the postgres user")
def test_a_non_root_cluster_runs_the_server_as_itself():
    assert catalog_server._os_user() is None
