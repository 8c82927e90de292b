"""Retries are logged once per fault (issue 36, point 13): a request's first retry is one WARNING
that states the limit, its later retries are DEBUG, a request that recovers says so at INFO, and
requests that retry while another one of the process already does add no warning. The CLI
against an unreachable endpoint (a closed local port) prints one warning, then its one-line
error."""

from __future__ import annotations

import logging
import os
import socket
import threading

import pytest

from support import run_cli
from tokenload.errors import StorageError
from tokenload.storage import remote
from tokenload.storage.options import StorageOptions

LOGGER = "tokenload"


def _closed_port() -> int:
    """A local port that refuses connections (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def options(monkeypatch):
    monkeypatch.setenv("TOKENLOAD_RETRIES", "3")
    monkeypatch.setenv("TOKENLOAD_RETRY_BACKOFF", "0.01")
    return StorageOptions.from_env()


class Flaky:
    """A request that is refused ``times`` times (a transient fault), then answers; with
    ``together``, its second attempt waits until every request of the barrier made its first."""

    def __init__(self, times: int, together: threading.Barrier | None = None) -> None:
        self.times, self.together, self.calls = times, together, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls == 2 and self.together is not None:
            self.together.wait(30)
        if self.calls <= self.times:
            raise ConnectionRefusedError(111, "Connection refused")
        return "ok"


def _records(caplog, level):
    return [
        r.getMessage() for r in caplog.records if r.levelno == level and "retr" in r.getMessage()
    ]


def test_a_request_that_fails_warns_once_and_logs_its_other_retries_at_debug(options, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with pytest.raises(StorageError) as caught:
        remote.call("s3://b/k", "read it", Flaky(10), options)
    assert "still after 3 retries" in caught.value.message
    (warning,) = _records(caplog, logging.WARNING)
    assert "retry 1 of 3" in warning and "DEBUG" in warning
    debug = _records(caplog, logging.DEBUG)
    assert len(debug) == 2 and "retry 2 of 3" in debug[0] and "retry 3 of 3" in debug[1]


def test_a_request_that_recovers_warns_once_and_says_so(options, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    assert remote.call("s3://b/k", "read it", Flaky(2), options) == "ok"
    assert len(_records(caplog, logging.WARNING)) == 1
    assert len(_records(caplog, logging.DEBUG)) == 1
    (info,) = _records(caplog, logging.INFO)
    assert "read it succeeded after 2 retries" in info
    caplog.clear()
    assert remote.call("s3://b/k", "read it", Flaky(0), options) == "ok"
    assert not caplog.records  # no fault, no line
    assert remote.call("s3://b/k", "read it", Flaky(1), options) == "ok"
    assert len(_records(caplog, logging.WARNING)) == 1  # a new fault warns again


def test_requests_retrying_together_are_one_fault(options, caplog):
    """Four threads' requests fail together (an outage): one warning in all, each one's retries
    at DEBUG; after they end, the next fault warns again."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    together = threading.Barrier(4)
    threads = [
        threading.Thread(
            target=remote.call, args=("s3://b/k", "read it", Flaky(3, together), options)
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(_records(caplog, logging.WARNING)) == 1
    assert len(_records(caplog, logging.INFO)) == 4  # each request's recovery
    caplog.clear()
    with pytest.raises(StorageError):
        remote.call("s3://b/k", "read it", Flaky(10), options)
    assert len(_records(caplog, logging.WARNING)) == 1


def test_the_cli_against_an_unreachable_endpoint_warns_once_then_prints_its_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TOKENLOAD_"))}
    env.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{_closed_port()}",
        AWS_ACCESS_KEY_ID="k",
        AWS_SECRET_ACCESS_KEY="s",
        AWS_DEFAULT_REGION="us-east-1",
        TOKENLOAD_RETRY_BACKOFF="0.05",
        TOKENLOAD_CACHE_DIR=str(tmp_path / "cache"),
    )
    done = run_cli("info", "s3://bucket/data/c", env=env, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert lines[-1].startswith("tokenload info: error: s3://bucket/data/c.idx: cannot read")
    assert "still after 3 retries" in lines[-1]  # the command's first-contact retries were made
    (warning,) = [line for line in lines if "WARNING" in line]
    assert "retry 1 of 3" in warning
    assert len(lines) == 2
