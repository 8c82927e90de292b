"""An S3 endpoint that accepts connections and never answers (a black-holed load balancer, a
stuck proxy): each attempt ends at the read timeout, is retried, and ends as a StorageError; a
command gives up within TOKENLOAD_FIRST_CONTACT_TIMEOUT; a process with a read budget
(``retry_reads_for``, the loader's worker_timeout) retries by time and ends before the budget."""

from __future__ import annotations

import dataclasses
import logging
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from support import run_cli
from tokenload.errors import ConfigError, StorageError
from tokenload.storage import remote
from tokenload.storage.chunks import RemoteBin
from tokenload.storage.options import StorageOptions, read_retry_window, retry_reads_for

URL = "s3://bucket/data/file.idx"


class SilentServer:
    """Accepts every connection on 127.0.0.1 and never sends a byte; counts the connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            if select.select([self.sock], [], [], 0.05)[0]:
                self.accepted.append(self.sock.accept()[0])

    def close(self) -> None:
        self.stopping.set()
        self.thread.join()
        for conn in [*self.accepted, self.sock]:
            conn.close()


@pytest.fixture
def silent(monkeypatch):
    server = SilentServer()
    values = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.port}", "AWS_ACCESS_KEY_ID": "k",
              "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1",
              "TOKENLOAD_CONNECT_TIMEOUT": "0.5", "TOKENLOAD_READ_TIMEOUT": "0.5",
              "TOKENLOAD_RETRY_BACKOFF": "0.05", "TOKENLOAD_RETRY_MAX_BACKOFF": "0.2"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    try:
        yield server
    finally:
        remote.fail_fast_before_first_contact(None)
        retry_reads_for(None)
        server.close()


def _warm(silent: SilentServer, options: StorageOptions) -> int:
    """Create this process's clients (imports and setup take seconds on a loaded machine) with one
    failed request of each kind, so that the timed requests time only the server's silence;
    returns the connections made so far."""
    once = dataclasses.replace(options, retries=0)
    for fn in (lambda: remote.info(URL, once), lambda: remote.ranged_get(URL, 0, 10, once)):
        with pytest.raises(Exception):  # noqa: B017  (a failed request of each kind, any error)
            remote.call(URL, "warm up", fn, once)
    remote.fail_fast_before_first_contact(None)
    return len(silent.accepted)


def _timed(fn):
    start = time.monotonic()
    with pytest.raises(StorageError) as caught:
        fn()
    return caught.value, time.monotonic() - start


@pytest.mark.parametrize("request_kind", ["head", "ranged_get"])
def test_each_attempt_ends_at_the_read_timeout_and_is_one_request(silent, monkeypatch,
                                                                   request_kind):
    """One connection per attempt: botocore's own retry (its ``max_attempts`` counts retries, so
    1 doubled every attempt, 2 x 60 s) is off, and the read timeout ends each one."""
    monkeypatch.setenv("TOKENLOAD_RETRIES", "2")
    options = StorageOptions.from_env()
    before = _warm(silent, options)
    if request_kind == "head":
        error, took = _timed(lambda: remote.info(URL, options))
    else:
        error, took = _timed(lambda: remote.call(URL, "read it", lambda: remote.ranged_get(
            URL, 0, 10, options), options))
    assert "still after 2 retries" in error.message and "Timeout" in error.message
    assert error.path == URL and "TOKENLOAD_READ_TIMEOUT" in error.hint
    assert len(silent.accepted) - before == 3
    assert 3 * 0.5 <= took < 3 * 0.5 + 5.0  # three timeouts, two backoffs (and a busy machine)


def test_a_command_gives_up_on_a_silent_endpoint_within_the_first_contact_timeout(silent,
                                                                                  monkeypatch):
    """The CLI's mode: 8 retries allowed, but no attempt starts that could end after
    TOKENLOAD_FIRST_CONTACT_TIMEOUT; later requests of the command give up at once."""
    monkeypatch.setenv("TOKENLOAD_READ_TIMEOUT", "1")
    monkeypatch.setenv("TOKENLOAD_FIRST_CONTACT_TIMEOUT", "4")
    options = StorageOptions.from_env()
    before = _warm(silent, options)
    remote.fail_fast_before_first_contact(8)
    error, took = _timed(lambda: remote.info(URL, options))
    assert took <= 4.0 + 1.0 and len(silent.accepted) - before >= 2
    assert "without an answer" in error.message
    assert "TOKENLOAD_FIRST_CONTACT_TIMEOUT" in error.message
    again, took_again = _timed(lambda: remote.info(URL.replace("file", "other"), options))
    assert took_again < 0.1 and "no answer from the endpoint" in again.message
    assert again.path.endswith("other.idx")


def test_the_cli_gives_up_on_a_silent_endpoint_with_one_line(silent):
    """``tokenload info`` against the silent endpoint: exit 2, one line naming the object, the
    time without an answer and the variable, within TOKENLOAD_FIRST_CONTACT_TIMEOUT."""
    import os

    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "TOKENLOAD_"))}
    env.update(TOKENLOAD_READ_TIMEOUT="1", TOKENLOAD_FIRST_CONTACT_TIMEOUT="4")
    done = run_cli("info", "s3://bucket/data/c", env=env, timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert last.startswith("tokenload info: error: s3://bucket/data/c.idx: cannot read")
    assert "s without an answer" in last and "TOKENLOAD_FIRST_CONTACT_TIMEOUT, 4 s" in last
    quiet = float(last.split(" s without an answer")[0].rsplit(" ", 1)[1])
    # the bound is kept from the first attempt on, which also makes the client (seconds on a
    # loaded machine); the library test above times warm clients exactly
    assert quiet <= 4.0 + 2.0 and len(silent.accepted) >= 1


def test_a_library_process_keeps_its_retries_on_a_silent_endpoint(silent, monkeypatch):
    """Without the CLI's fail-fast (a training job), TOKENLOAD_RETRIES decides, not the
    first-contact bound."""
    monkeypatch.setenv("TOKENLOAD_FIRST_CONTACT_TIMEOUT", "0.5")
    monkeypatch.setenv("TOKENLOAD_RETRIES", "3")
    options = StorageOptions.from_env()
    before = _warm(silent, options)
    error, _ = _timed(lambda: remote.info(URL, options))
    assert "still after 3 retries" in error.message and len(silent.accepted) - before == 4


def test_a_read_budget_retries_by_time_and_ends_before_it(silent, monkeypatch, caplog):
    """``retry_reads_for`` (the loader's worker_timeout): retries beyond TOKENLOAD_RETRIES while
    the budget allows, one warning saying how long is left (the other retries at DEBUG), the
    error before the budget."""
    caplog.set_level(logging.DEBUG, logger="tokenload")
    monkeypatch.setenv("TOKENLOAD_RETRIES", "0")
    options = StorageOptions.from_env()
    before = _warm(silent, options)
    caplog.clear()
    retry_reads_for(5.0)
    assert read_retry_window() == 5.0
    error, took = _timed(lambda: remote.call(
        URL, "read bytes [0, 10)", lambda: remote.ranged_get(URL, 0, 10, options), options))
    assert took <= 5.0 + 1.0  # no attempt starts that could end after the budget
    made = len(silent.accepted) - before
    assert made >= 2  # TOKENLOAD_RETRIES=0, yet retried within the budget
    assert "reads are retried for up to 5 s" in error.message and "worker_timeout" in error.message
    retries = [r for r in caplog.records if "; retry " in r.getMessage()]
    assert len(retries) == made - 1 and retries[0].levelno == logging.WARNING
    assert all(r.levelno == logging.DEBUG for r in retries[1:])
    assert all("retrying for up to" in r.getMessage() and "s more" in r.getMessage() for r in retries)


def test_bad_timeouts_and_budgets_are_config_errors(monkeypatch):
    for name, value in (("TOKENLOAD_READ_TIMEOUT", "0"), ("TOKENLOAD_CONNECT_TIMEOUT", "inf"),
                        ("TOKENLOAD_FIRST_CONTACT_TIMEOUT", "-1")):
        monkeypatch.setenv(name, value)
        with pytest.raises(ConfigError) as caught:
            StorageOptions.from_env()
        assert name in caught.value.hint
        monkeypatch.delenv(name)
    for budget in (0, -5, float("nan"), float("inf")):
        with pytest.raises(ConfigError):
            retry_reads_for(budget)
    assert read_retry_window() is None


class _HeadOnly(BaseHTTPRequestHandler):
    """Answers HEAD (an object of 4096 bytes) and never answers a GET: a server that hangs
    under a running job after the files were opened."""

    protocol_version = "HTTP/1.1"
    released = threading.Event()
    gets = 0

    def do_HEAD(self) -> None:  # the name http.server calls
        self.send_response(200)
        for name, value in (("Content-Length", "4096"), ("ETag", '"e1"'),
                            ("Last-Modified", "Wed, 02 Dec 2026 04:00:00 GMT")):
            self.send_header(name, value)
        self.end_headers()

    def do_GET(self) -> None:  # the name http.server calls
        type(self).gets += 1
        self.released.wait(30)
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


def test_a_training_read_of_a_server_gone_silent_ends_within_its_budget(monkeypatch, caplog):
    """A ``.bin`` opened (its HEAD answered), then every GET hangs: the chunk read through
    ``chunks.RemoteBin`` retries while the budget allows, warns, and raises before it."""
    caplog.set_level(logging.WARNING, logger="tokenload")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HeadOnly)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _HeadOnly.released.clear()
    values = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_address[1]}",
              "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
              "AWS_DEFAULT_REGION": "us-east-1",
              "TOKENLOAD_RETRIES": "0", "TOKENLOAD_CONNECT_TIMEOUT": "0.5",
              "TOKENLOAD_READ_TIMEOUT": "0.5", "TOKENLOAD_RETRY_BACKOFF": "0.05",
              "TOKENLOAD_PREFETCH": "0"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    try:
        source = RemoteBin("s3://bucket/data/c.bin", np.uint16)
        with pytest.raises(StorageError):  # the clients made, as a worker has them after a batch
            source._read(0, 8)
        gets = _HeadOnly.gets
        caplog.clear()
        retry_reads_for(5.0)
        error, took = _timed(lambda: source._read(0, 8))
        assert took <= 5.0 + 1.0 and _HeadOnly.gets - gets >= 2
        assert error.path == "s3://bucket/data/c.bin"
        assert "reads are retried for up to 5 s" in error.message
        assert any("retrying for up to" in r.getMessage() for r in caplog.records)
    finally:
        retry_reads_for(None)
        _HeadOnly.released.set()
        server.shutdown()
        server.server_close()
