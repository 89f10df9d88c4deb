"""TLS: a throwaway CA and server certificate (openssl command line), a redis-server with
a TLS port, and the core, a real ``celery worker`` on ``belayqs://`` and a real ``rq
worker`` on ``rediss://`` working over it, certificates verified. CI's Debian redis-server
7.x has TLS: there a missing TLS build or openssl fails instead of skipping."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest
import redis
import rq
from rq.job import JobStatus

from belayq import ReliableQueue
from belayq.embedded import RedisServer, free_port
from tests.badinput.helpers import CeleryWorker, celery_app, start_server
from tests.conftest import unavailable
from tests.plugins.kombu.test_transport import drain
from tests.plugins.rq import jobs
from tests.plugins.rq.conftest import Workers
from tests.support import wait_for


def make_ca(d: Path) -> Path:
    """A CA, and a server certificate for 127.0.0.1 signed by it, in ``d``; returns the CA."""
    if shutil.which("openssl") is None:
        unavailable("the openssl command is needed to make a test CA")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    # keyUsage: Python 3.13's default context verifies strictly (VERIFY_X509_STRICT).
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "1", "-subj", "/CN=belayq test CA",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
            "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf")
    return d / "ca.pem"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """(TLS port, CA file) of a redis-server with a TLS port (clients need no certificate)."""
    d = tmp_path_factory.mktemp("tls")
    ca = make_ca(d)
    port = free_port()
    try:
        server: RedisServer = start_server([
            "--tls-port", str(port), "--tls-cert-file", str(d / "server.pem"),
            "--tls-key-file", str(d / "server.key"), "--tls-ca-cert-file", str(ca),
            "--tls-auth-clients", "no",
        ])
    except RuntimeError as exc:
        unavailable(f"this redis-server has no TLS support: {exc}")
    yield port, ca
    server.stop()


def test_the_core_over_tls(tls: tuple[int, Path]) -> None:
    port, ca = tls
    client = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca),
                         ssl_cert_reqs="required")
    q = ReliableQueue(client, "tls-core", keeper=False)
    q.publish(b"over tls")
    d = q.claim(1)[0]
    assert d.payload == b"over tls" and q.ack(d)
    # Without the CA the server certificate is refused.
    plain = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_cert_reqs="required")
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        plain.ping()


def test_a_celery_worker_over_belayqs(tls: tuple[int, Path], tmp_path: Path) -> None:
    port, ca = tls
    env = {"BQ_BROKER": f"belayqs://127.0.0.1:{port}/0", "BQ_BACKEND": f"rediss://127.0.0.1:{port}/1",
           "BQ_QUEUE": "tls", "BQ_CA": str(ca)}
    w = CeleryWorker(tmp_path / "worker.log", "--pool=solo", **env).wait_ready()
    try:
        app = celery_app(env)
        assert [app.record.delay(str(i)).get(timeout=30) for i in range(3)] == [0, 0, 0]
        assert "transport:   belayqs://" in w.text()
    finally:
        w.stop()


def test_an_rq_worker_over_rediss(tls: tuple[int, Path], tmp_path: Path) -> None:
    port, ca = tls
    url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}"
    conn = redis.Redis.from_url(url)
    ws = Workers(url, tmp_path)
    try:
        proc = ws.start("tlsq", worker_class="belayq_rq.Worker")
        done = [rq.Queue("tlsq", connection=conn).enqueue(jobs.add, i, 1) for i in range(3)]
        wait_for(lambda: all(j.get_status() == JobStatus.FINISHED for j in done), 60, "jobs")
        assert [j.return_value() for j in done] == [1, 2, 3] and proc.poll() is None
    finally:
        ws.stop_all()
        conn.close()


def test_belayqs_publishes_and_consumes_with_kombu(tls: tuple[int, Path]) -> None:
    port, ca = tls
    name = f"tls-{uuid.uuid4().hex[:8]}"
    q = kombu.Queue(name, routing_key=name)
    options = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(ca)}
    with kombu.Connection(f"belayqs://127.0.0.1:{port}/0", ssl=options) as conn:
        conn.Producer().publish({"over": "tls"}, routing_key=name, declare=[q])
        got = drain(conn, [q], 1, prefetch_count=1)
        assert [m.payload for m in got] == [{"over": "tls"}]
        pool = conn.default_channel.core_client.connection_pool
        assert "SSL" in pool.connection_class.__name__


def test_belayqs_verifies_the_server_certificate_by_default(tls: tuple[int, Path]) -> None:
    port, _ = tls
    with pytest.raises(Exception, match="certificate verify failed"):
        kombu.Connection(f"belayqs://127.0.0.1:{port}/0").connect()
