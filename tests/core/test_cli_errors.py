"""What ``belayq`` says when it cannot use its server: one line on stderr, exit status 2, the
server's (or the network's) own reason, the URL as asked without its password, and no
traceback: a database out of range, a refused connection, a host that does not resolve, a
missing socket, a password missing or wrong, an ACL that refuses, TLS on one side only or an
unknown CA, a server that never answers, and URLs that cannot be used as written."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer, free_port
from tests.conftest import any_binary
from tests.core.conftest import run

PASSWORD = "s3cret-pw-xyz"


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``belayq`` and return its error line, checking the exit status, that stdout is
    empty, that it is one line and holds no password."""
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    assert not out and len(err.strip().splitlines()) == 1, err
    assert PASSWORD not in err and "Traceback" not in err
    return err.strip()


@pytest.fixture(scope="module")
def locked() -> Iterator[RedisServer]:
    """A server that asks for a password, with an ACL user allowed PING only."""
    with RedisServer(any_binary()) as server:
        admin = redis.Redis(port=server.port)
        admin.config_set("requirepass", PASSWORD)  # after start: it waits for a PONG
        admin.acl_setuser("pinger", enabled=True, passwords=[f"+{PASSWORD}"],
                          commands=["+ping"], keys=["*"])
        admin.close()
        yield server


def test_a_database_out_of_range_names_the_servers_reason_and_the_database(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = url.rsplit("/", 1)[0] + "/99"
    err = one_line_error(capsys, "queues", "--url", bad)
    assert "DB index is out of range" in err and "database 99" in err and bad in err
    assert "ResponseError" not in err
    err = one_line_error(capsys, "stats", "--url", f"{url}?db=77", "q")
    assert "DB index is out of range" in err and "database 77" in err


def test_unreachable_servers_name_the_networks_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    refused = f"redis://127.0.0.1:{free_port()}/0"
    err = one_line_error(capsys, "queues", "--url", refused)
    assert "Connection refused" in err and refused in err and "ConnectionError" not in err
    err = one_line_error(capsys, "queues", "--url", "redis://no-such-host.invalid:6379/0")
    assert "no-such-host.invalid" in err and "does not resolve" in err
    # unix:// took options redis-py's socket connection refuses: a traceback before.
    sock = tmp_path / "none.sock"
    err = one_line_error(capsys, "queues", "--url", f"unix://{sock}")
    assert "No such file or directory" in err and f"unix://{sock}" in err


def test_a_unix_socket_url_works(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sock = tmp_path / "r.sock"
    with RedisServer(any_binary(), args=["--unixsocket", str(sock)]) as server:
        ReliableQueue(redis.Redis(port=server.port), "by-socket", keeper=False).publish(b"x")
        code, out, err = run(capsys, "queues", "--url", f"unix://{sock}?db=0")
    assert code == 0 and "by-socket" in out, err


def test_a_server_that_never_answers_times_out_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as mute:  # accepts connections (the backlog), answers nothing
        mute.bind(("127.0.0.1", 0))
        mute.listen(4)
        url = f"redis://127.0.0.1:{mute.getsockname()[1]}/0?socket_timeout=0.3"
        err = one_line_error(capsys, "queues", "--url", url)
    assert "timed out" in err and "Timeout reading from socket" in err and url in err


def test_passwords_and_acls_name_the_servers_reason_and_the_user(
    locked: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    hostport = f"127.0.0.1:{locked.port}"
    err = one_line_error(capsys, "queues", "--url", f"redis://{hostport}/0")
    assert "NOAUTH" in err and "password" in err and f"redis://{hostport}/0" in err
    err = one_line_error(capsys, "queues", "--url", f"redis://:wrong-{PASSWORD}@{hostport}/0")
    assert "WRONGPASS" in err and f"redis://:***@{hostport}/0" in err
    err = one_line_error(capsys, "queues", "--url", f"redis://pinger:{PASSWORD}@{hostport}/0")
    assert "NOPERM" in err and "user pinger" in err and "pinger:***@" in err
    # A password given as a URL option is hidden as well.
    err = one_line_error(capsys, "queues", "--url", f"redis://{hostport}/0?password=x{PASSWORD}")
    assert "password=***" in err and "WRONGPASS" in err


def test_tls_on_one_side_only_or_an_unknown_ca_is_said(
    tls_server: tuple[RedisServer, int, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    server, port, ca = tls_server
    err = one_line_error(capsys, "queues", "--url", f"redis://127.0.0.1:{port}/0")
    assert "rediss://" in err  # plain redis:// to the TLS port
    err = one_line_error(capsys, "queues", "--url",
                         f"rediss://127.0.0.1:{server.port}/0?socket_timeout=0.5")
    assert "TLS" in err and "timed out" in err  # rediss:// to the plain port
    err = one_line_error(capsys, "queues", "--url", f"rediss://127.0.0.1:{port}/0")
    assert "CERTIFICATE_VERIFY_FAILED" in err and "ssl_ca_certs" in err
    err = one_line_error(capsys, "queues", "--url",
                         f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}.missing")
    assert "ssl_ca_certs" in err and "names no file" in err
    code, out, err = run(capsys, "queues", "--url", f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}")
    assert code == 0, err


def test_urls_that_cannot_be_used_as_written_are_refused(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = url.rsplit("/", 1)[0]
    err = one_line_error(capsys, "queues", "--url", f"{base}/x")  # was database 0, silently
    assert "must be a number" in err and "'x'" in err
    err = one_line_error(capsys, "queues", "--url", f"{url}?db=one")
    assert "must be a number" in err
    err = one_line_error(capsys, "queues", "--url", "http://example.com")
    assert "not a Redis URL" in err


def test_errors_after_connecting_name_the_url_and_the_acl_user(
    server: RedisServer, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    user = f"cli-{uuid.uuid4().hex[:6]}"
    admin = redis.Redis(port=server.port)
    ReliableQueue(admin, "emails", keeper=False).publish(b"x")
    admin.acl_setuser(user, enabled=True, passwords=[f"+{PASSWORD}"],
                      commands=["+@all", "-evalsha", "-eval", "-fcall", "-fcall_ro"], keys=["*"],
                      channels=["*"])
    try:
        as_user = f"redis://{user}:{PASSWORD}@127.0.0.1:{server.port}/0"
        err = one_line_error(capsys, "stats", "--url", as_user, "emails")
        assert "NOPERM" in err and f"user {user}" in err and f"{user}:***@" in err
        err = one_line_error(capsys, "stats", "--url", url, "no-such-queue")
        assert "no queue 'no-such-queue'" in err and url in err
    finally:
        admin.acl_deluser(user)
        admin.close()
