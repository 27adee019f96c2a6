"""TLS and authentication, each on a one-member cluster of its own: what works, and the one
line a daemon's operator reads for each mistake (never with the password in it)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaderd.backends import Backend, BackendFatal, Candidate, backend_from_url
from leaderd.backends.etcd.backend import EtcdBackend
from leaderd.backends.etcd.gateway import PASSWORD_ENV
from tests.support import tls
from tests.support.backend_calls import ask, release
from tests.support.daemons import Daemon, short_tempdir
from tests.support.etcd_cluster import EtcdCluster, Tls

PASSWORD = "s3cr3t-Pa55:word"  # a test fixture, not a secret
QUOTED = "s3cr3t-Pa55%3Aword"
ME = Candidate("node-a", "10.0.0.1:80")


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> tls.Material:
    return tls.make(str(tmp_path_factory.mktemp("tls")))


@pytest.fixture(scope="module")
def tls_cluster(material: tls.Material) -> Iterator[EtcdCluster]:
    server = Tls(material.server_cert, material.server_key, material.cacert,
                 material.client_cert, material.client_key)  # fmt: skip
    cluster = EtcdCluster(1, tls=server)
    try:
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture(scope="module")
def auth_cluster() -> Iterator[EtcdCluster]:
    # A 1 s token: the daemon's token expires between its renewals and it logs in again.
    cluster = EtcdCluster(1, extra_args=("--auth-token-ttl", "1"))
    try:
        cluster.etcdctl("user", "add", f"root:{PASSWORD}", "--interactive=false")
        cluster.etcdctl("role", "add", "leaderd")
        cluster.etcdctl("role", "grant-permission", "leaderd", "--prefix=true", "readwrite", "/ok/")
        cluster.etcdctl("user", "add", f"limited:{PASSWORD}", "--interactive=false")
        cluster.etcdctl("user", "grant-role", "limited", "leaderd")
        cluster.etcdctl("auth", "enable")
        yield cluster
    finally:
        cluster.cleanup()


async def open_backend(url: str, opened: list[Backend]) -> Backend:
    backend = backend_from_url(url)
    opened.append(backend)
    await backend.open(["default"])
    return backend


async def elect(url: str, opened: list[Backend]) -> None:
    """Lead, then release on the release's own connection, with its TLS and its token."""
    backend = await open_backend(url, opened)
    lease = await ask(backend, "default", ME, 5.0, timeout=5.0)
    assert lease.held_by(ME), lease
    assert isinstance(backend, EtcdBackend)
    async with asyncio.timeout(3):
        while not backend.line.open:  # noqa: ASYNC110 - it opens in the background
            await asyncio.sleep(0.01)
    await release(backend, "default", ME, lease.term)
    assert backend.line.answered == 1
    assert (await backend.observe("default")).holder is None


def tls_url(cluster: EtcdCluster, **files: str) -> str:
    return cluster.url(prefix=f"/t-{uuid.uuid4().hex[:8]}/", **files)


async def test_tls_with_a_client_certificate(
    tls_cluster: EtcdCluster, material: tls.Material, opened: list[Backend]
) -> None:
    url = tls_url(tls_cluster, cacert=material.cacert, cert=material.client_cert,
                  key=material.client_key)  # fmt: skip
    await elect(url, opened)


async def test_a_server_certificate_from_another_ca_is_fatal_in_one_line(
    tls_cluster: EtcdCluster, material: tls.Material, opened: list[Backend]
) -> None:
    url = tls_url(tls_cluster, cacert=material.other_cacert, cert=material.client_cert,
                  key=material.client_key)  # fmt: skip
    with pytest.raises(BackendFatal) as caught:
        await open_backend(url, opened)
    message = str(caught.value)
    assert "certificate is not trusted" in message and "\n" not in message, message


async def test_no_client_certificate_is_an_error_in_one_line(
    tls_cluster: EtcdCluster, material: tls.Material, opened: list[Backend]
) -> None:
    with pytest.raises(BackendFatal) as caught:
        await open_backend(tls_url(tls_cluster, cacert=material.cacert), opened)
    message = str(caught.value)
    assert "refused our client certificate" in message and "\n" not in message, message


def auth_url(cluster: EtcdCluster, userinfo: str, prefix: str = "/ok/") -> str:
    host = cluster.members[0].hostport
    return f"etcd://{userinfo}{host}/?prefix={prefix}{uuid.uuid4().hex[:8]}/"


async def test_a_password_from_the_url_or_the_environment_logs_in(
    auth_cluster: EtcdCluster, opened: list[Backend], monkeypatch: pytest.MonkeyPatch
) -> None:
    await elect(auth_url(auth_cluster, f"root:{QUOTED}@"), opened)
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    await elect(auth_url(auth_cluster, "limited@"), opened)


async def test_an_expired_token_logs_in_again(
    auth_cluster: EtcdCluster, opened: list[Backend]
) -> None:
    backend = await open_backend(auth_url(auth_cluster, f"root:{QUOTED}@"), opened)
    first = await ask(backend, "default", ME, 5.0, timeout=5.0)
    await asyncio.sleep(2.5)  # past the 1 s token (etcd checks every second)
    again = await ask(backend, "default", ME, 5.0, timeout=5.0)
    assert again.held_by(ME) and again.term == first.term


@pytest.mark.parametrize(
    ("userinfo", "prefix", "says"),
    [
        ("root:wrong@", "/ok/", "authentication as 'root' failed: wrong user name or password"),
        ("", "/ok/", "etcd has authentication enabled"),
        (f"limited:{QUOTED}@", "/elsewhere/", "permission denied"),
    ],
)
async def test_credential_mistakes_are_fatal_in_one_line(
    auth_cluster: EtcdCluster, opened: list[Backend], userinfo: str, prefix: str, says: str
) -> None:
    with pytest.raises(BackendFatal) as caught:
        await elect(auth_url(auth_cluster, userinfo, prefix), opened)
    message = str(caught.value)
    assert says in message and "\n" not in message, message
    assert PASSWORD not in message and QUOTED not in message and "wrong" not in message[-8:]


@pytest.mark.slow
def test_the_password_is_never_logged_or_served(auth_cluster: EtcdCluster) -> None:
    workdir = short_tempdir()
    daemon = Daemon("node-a", auth_url(auth_cluster, "root@"), workdir=workdir,
                    env={PASSWORD_ENV: PASSWORD})  # fmt: skip
    bad = Daemon("node-b", auth_url(auth_cluster, f"root:{QUOTED}x@"), workdir=workdir)
    try:
        daemon.start().wait_ready()
        assert daemon.is_leader()
        code, status = daemon.get("/status")
        assert code == 200 and PASSWORD not in str(status) and QUOTED not in str(status)
        assert bad.start().wait(15) == 1  # wrong password: exits 1 at start
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0
        for d in (daemon, bad):
            assert PASSWORD not in d.log() and QUOTED not in d.log(), d.log()
        assert "wrong user name or password" in bad.log()
    finally:
        daemon.kill()
        bad.kill()
        subprocess.run(["rm", "-rf", workdir], check=False)


def test_tls_material_is_made_fresh(material: tls.Material) -> None:
    assert all(Path(p).stat().st_size > 0 for p in vars(material).values())
