"""One direction of a pipe between a loader and its worker processes, carrying the records of
``messages.py``."""

from __future__ import annotations

import os
import pickle
import select
import struct
import time
from multiprocessing.connection import Connection
from typing import Any, Generic

from .messages import M, decode, encode

_HEADER = struct.Struct("<Q")


class Channel(Generic[M]):
    """One direction of a pipe, speaking length-prefixed pickles of messages
    (``messages.encode``) with as few system calls as possible: a send is one ``write``; a
    receive reads whatever has arrived (often several messages) in one ``read``; waiting uses
    one ``poll`` object made once. ``multiprocessing``'s
    Connection costs two reads per message and builds a selector per ``poll`` (measured on the
    2-core development VM: about a third of a worker's time per batch). The Connection it wraps is
    what crosses the process boundary (it pickles for spawn and forkserver).

    The training process's ends never block on a write (``unblock``): what the pipe cannot take
    now waits in ``pending`` bytes, written by ``drain`` when the loader waits anyway, so a worker
    that stops reading (stopped, stuck in a read) cannot hang a send."""

    def __init__(self, connection: Connection) -> None:
        self._setup(connection)

    def _setup(self, connection: Connection) -> None:
        self.connection = connection
        self._fd: int | None = None
        self._out = bytearray()
        self._blocking = True
        self.heard = 0.0  # time.monotonic() of the last bytes received

    def __getstate__(self) -> dict[str, Any]:
        return {"connection": self.connection}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["connection"])

    def fileno(self) -> int:
        return self._open()

    def _open(self) -> int:
        if self._fd is None:
            self._fd = self.connection.fileno()
            self._buffer = bytearray()
            self._poller = select.poll()
            self._poller.register(self._fd, select.POLLIN)
        return self._fd

    def unblock(self) -> None:
        """Never block in ``send`` again: bytes the pipe cannot take now wait in ``pending``."""
        os.set_blocking(self._open(), False)
        self._blocking = False

    @property
    def pending(self) -> int:
        """Bytes sent but not yet written into the pipe (only after ``unblock``)."""
        return len(self._out)

    def send(self, message: M) -> None:
        payload = pickle.dumps(encode(message), protocol=pickle.HIGHEST_PROTOCOL)
        if not self._blocking:
            self._out += _HEADER.pack(len(payload))
            self._out += payload
            self.drain()
            return
        data = memoryview(_HEADER.pack(len(payload)) + payload)
        fd = self._open()
        while data:
            data = data[os.write(fd, data) :]

    def drain(self) -> int:
        """Write what the pipe takes now of the pending bytes (never blocks); bytes written.
        BrokenPipeError when the reader is gone."""
        fd, written = self._open(), 0
        while self._out:
            try:
                n = os.write(fd, memoryview(self._out)[: 1 << 20])
            except BlockingIOError:
                break
            del self._out[:n]
            written += n
        return written

    def _complete(self) -> bool:
        buf = self._buffer
        return len(buf) >= _HEADER.size and len(buf) >= _HEADER.size + _HEADER.unpack_from(buf)[0]

    def poll(self, timeout: float) -> bool:
        """Whether a whole message can be received now, waiting up to ``timeout`` seconds for data
        (about twice that when part of a message came; ``recv`` after True never waits)."""
        fd = self._open()
        if self._complete():
            return True
        if not self._poller.poll(timeout * 1000):
            return False
        self._fill(fd)
        if self._complete():
            return True
        end = time.monotonic() + timeout  # part of a message came: wait as long for the rest
        while (left := end - time.monotonic()) > 0 and self._poller.poll(left * 1000):
            self._fill(fd)
            if self._complete():
                return True
        return False

    def _fill(self, fd: int) -> None:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise EOFError("the other end of the pipe is closed")
        self._buffer += chunk
        self.heard = time.monotonic()

    def recv(self) -> M:
        fd = self._open()
        while not self._complete():
            self._fill(fd)
        size = _HEADER.unpack_from(self._buffer)[0]
        end = _HEADER.size + size
        message = decode(pickle.loads(memoryview(self._buffer)[_HEADER.size : end]))
        del self._buffer[:end]
        return message  # type: ignore[return-value]  # the other end sends this channel's kind

    def close(self) -> None:
        self.connection.close()
