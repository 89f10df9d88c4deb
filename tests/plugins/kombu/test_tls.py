"""belayqs://: the same transport over TLS, against a redis-server with a TLS port and a
throwaway CA made with the openssl command line."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest

from belayq.embedded import RedisServer

from .test_transport import drain


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test CA")
    d = tmp_path_factory.mktemp("tls")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "1", "-subj", "/CN=belayq test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
            "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf")
    from belayq.embedded import free_port

    tls_port = free_port()
    server = RedisServer(args=[
        "--tls-port", str(tls_port), "--tls-cert-file", str(d / "server.pem"),
        "--tls-key-file", str(d / "server.key"), "--tls-ca-cert-file", str(d / "ca.pem"),
        "--tls-auth-clients", "no",
    ])
    try:
        server.start()
    except RuntimeError as exc:
        pytest.skip(f"this redis-server has no TLS support: {exc}")
    try:
        yield tls_port, d / "ca.pem"
    finally:
        server.stop()


def test_belayqs_publishes_and_consumes_over_tls(tls_server: tuple[int, Path], kq: str) -> None:
    port, ca = tls_server
    q = kombu.Queue(kq, routing_key=kq)
    tls = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(ca)}
    with kombu.Connection(f"belayqs://127.0.0.1:{port}/0", ssl=tls) as conn:
        conn.Producer().publish({"over": "tls"}, routing_key=kq, declare=[q])
        got = drain(conn, [q], 1, prefetch_count=1)
        assert [m.payload for m in got] == [{"over": "tls"}]
        pool = conn.default_channel.core_client.connection_pool
        assert "SSL" in pool.connection_class.__name__


def test_belayqs_verifies_the_server_certificate_by_default(tls_server: tuple[int, Path]) -> None:
    port, _ = tls_server
    with pytest.raises(Exception, match="certificate verify failed"):
        kombu.Connection(f"belayqs://127.0.0.1:{port}/0").connect()
