"""One direction of a pipe between a loader and its worker processes."""

from __future__ import annotations

import os
import pickle
import select
import struct

_HEADER = struct.Struct("<Q")


class Channel:
    """One direction of a pipe, speaking length-prefixed pickles with as few system calls as
    possible: a send is one ``write``; a receive reads whatever has arrived (often several
    messages) in one ``read``; waiting uses one ``poll`` object made once. ``multiprocessing``'s
    Connection costs two reads per message and builds a selector per ``poll`` (measured on the
    2-core development VM: about a third of a worker's time per batch). The Connection it wraps is what
    crosses the process boundary (it pickles for spawn and forkserver)."""

    def __init__(self, connection) -> None:
        self.connection = connection
        self._fd: int | None = None

    def __getstate__(self) -> dict:
        return {"connection": self.connection}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["connection"])

    def _open(self) -> int:
        if self._fd is None:
            self._fd = self.connection.fileno()
            self._buffer = bytearray()
            self._poller = select.poll()
            self._poller.register(self._fd, select.POLLIN)
        return self._fd

    def send(self, message: tuple) -> None:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        data = memoryview(_HEADER.pack(len(payload)) + payload)
        fd = self._open()
        while data:
            data = data[os.write(fd, data) :]

    def _complete(self) -> bool:
        buf = self._buffer
        return len(buf) >= _HEADER.size and len(buf) >= _HEADER.size + _HEADER.unpack_from(buf)[0]

    def poll(self, timeout: float) -> bool:
        """Whether a whole message can be received now, waiting up to ``timeout`` seconds for data."""
        fd = self._open()
        if self._complete():
            return True
        if not self._poller.poll(timeout * 1000):
            return False
        self._fill(fd)
        return True

    def _fill(self, fd: int) -> None:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise EOFError("the other end of the pipe is closed")
        self._buffer += chunk

    def recv(self) -> tuple:
        fd = self._open()
        while not self._complete():
            self._fill(fd)
        size = _HEADER.unpack_from(self._buffer)[0]
        end = _HEADER.size + size
        message = pickle.loads(memoryview(self._buffer)[_HEADER.size : end])
        del self._buffer[:end]
        return message

    def close(self) -> None:
        self.connection.close()
