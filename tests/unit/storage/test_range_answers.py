"""A ranged GET's answer must hold the bytes asked for. HTTP lets a server (or a proxy in front
of it) ignore ``Range`` and answer 200 with the whole object; the part reads took its first
bytes as bytes ``[start, end)`` and served other rows with no error (a red-team finding, run
against SeaweedFS behind a proxy that drops the header). Both ranged reads check the answer's
``Content-Range`` here, against answers shaped as botocore returns them."""

from __future__ import annotations

import io

import pytest

from tokenload.errors import StorageError
from tokenload.storage import remote

OBJECT = bytes(range(256)) * 64  # 16 KiB


class _Client:
    def __init__(self, honour_range: bool, shift: int = 0) -> None:
        self.honour_range, self.shift = honour_range, shift

    def get_object(self, Bucket: str, Key: str, Range: str) -> dict:
        first, last = (int(x) for x in Range.removeprefix("bytes=").split("-"))
        if not self.honour_range:  # 200, the whole object
            return {"Body": io.BytesIO(OBJECT), "ContentLength": len(OBJECT), "ETag": '"e"'}
        first += self.shift
        body = OBJECT[first : last + 1 + self.shift]
        return {
            "Body": io.BytesIO(body),
            "ContentLength": len(body),
            "ContentRange": f"bytes {first}-{first + len(body) - 1}/{len(OBJECT)}",
            "ETag": '"e"',
        }


@pytest.mark.parametrize("read", ["ranged_get", "ranged_get_into"])
@pytest.mark.parametrize(
    "honour_range, shift, start, ok",
    [
        (True, 0, 4096, True),  # 206 with the range asked for
        (False, 0, 4096, False),  # 200 with the whole object: other bytes
        (True, 512, 4096, False),  # a range that starts elsewhere
        (False, 0, 0, False),  # the whole object, bigger than the range asked for from 0
    ],
)
def test_only_the_bytes_asked_for_are_taken(monkeypatch, read, honour_range, shift, start, ok):
    monkeypatch.setattr(remote, "_botocore", lambda options: _Client(honour_range, shift))
    end = start + 1024
    url = "s3://bucket/key.bin"

    def call() -> bytes:
        if read == "ranged_get":
            return remote.ranged_get(url, start, end)[0]
        out = bytearray(end - start)
        sent, _ = remote.ranged_get_into(url, start, memoryview(out))
        return bytes(out[:sent])

    if ok:
        assert call() == OBJECT[start:end]
    else:
        with pytest.raises(StorageError, match=r"expected those bytes \(206 Partial Content\)"):
            call()


def test_a_whole_object_within_the_range_from_0_is_those_bytes(monkeypatch):
    small = OBJECT[:100]

    class Whole:
        def get_object(self, Bucket: str, Key: str, Range: str) -> dict:
            return {"Body": io.BytesIO(small), "ContentLength": len(small)}

    monkeypatch.setattr(remote, "_botocore", lambda options: Whole())
    assert remote.ranged_get("s3://bucket/k", 0, 1024)[0] == small
