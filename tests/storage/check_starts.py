"""Start and stop SeaweedFS as the storage tests do, N times in a row, and report every failed
start and whatever the servers left in /tmp (issue 25, points 9 and 10).

    .venv/bin/python tests/storage/check_starts.py 20
    .venv/bin/python tests/storage/check_starts.py 2 --conftest OLD_CONFTEST.py   (a comparison)

Each round starts three servers side by side (the session's, the credentials-checking one and a
test's private one) on ports drawn by this conftest's ``server_ports``, then stops them. What a
server left is matched by its own ports and process id (other sessions may run servers at the
same time): the sockets ``/tmp/seaweedfs-*-{port}.sock``, weed's log files
``/tmp/weed.*.{pid}`` and its TMPDIR. Exit status 0 when every server started and none left
anything.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _load(path: Path):
    spec = importlib.util.spec_from_file_location("weed_conftest", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _left(ports: dict, pid: int, tmpdir: str | None) -> list[str]:
    found = []
    for port in ports.values():
        for offset in (0, 10000):
            found += [p.name for p in Path("/tmp").glob(f"seaweedfs-*-{port + offset}.sock")]
    found += [p.name for p in Path("/tmp").glob(f"weed.*.{pid}")]
    if tmpdir and Path(tmpdir).exists():
        found.append(tmpdir)
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("rounds", type=int, nargs="?", default=20)
    parser.add_argument("--conftest", type=Path, default=HERE / "conftest.py")
    args = parser.parse_args()
    weed = _load(args.conftest)
    draw = _load(HERE / "conftest.py").server_ports  # the same kind of ports for either version
    failed, left = 0, []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="check-starts-") as root:
            servers = []
            start = time.monotonic()
            try:
                for name in ("session", "auth", "private"):
                    folder = Path(root) / name
                    folder.mkdir()
                    ports = draw()
                    servers.append((ports, weed.start_server(folder, ports)))
                print(f"round {i + 1}: 3 servers up in {time.monotonic() - start:.1f} s, s3 ports"
                      f" {[ports['s3'] for ports, _ in servers]}", flush=True)
            except RuntimeError as exc:
                failed += 1
                print(f"round {i + 1}: FAILED {exc}", flush=True)
            finally:
                for ports, (proc, _, log) in servers:
                    weed.stop_server(proc, log)
                    left += _left(ports, proc.pid, getattr(proc, "tmpdir", None))
    print(f"{args.rounds - failed} of {args.rounds} rounds started every server; left in /tmp by"
          f" these servers: {len(left)} {sorted(left)[:12]}")
    return 0 if failed == 0 and not left else 1


if __name__ == "__main__":
    sys.exit(main())
