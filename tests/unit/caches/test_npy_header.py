"""caches.files._read_npy_header: numpy.save's headers read by one regex, the rest by numpy."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tokenload.caches import files
from tokenload.errors import FormatError

ARRAYS = [
    np.arange(5, dtype=np.int32),
    np.zeros((3, 4), dtype=np.int64),
    np.asfortranarray(np.ones((2, 3), dtype=np.float64)),
    np.zeros(0, dtype=np.int16),
    np.zeros((0, 2), dtype=np.uint16),
    np.array(7, dtype=np.uint8),
    np.zeros((2, 1, 3), dtype=">i8"),
    np.zeros(4, dtype=bool),
    np.zeros(123_456_789_012 // 10**9, dtype=np.float32),
]


def numpy_header(data: bytes):
    f = io.BytesIO(data)
    np.lib.format.read_magic(f)
    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    return tuple(shape), bool(fortran), dtype, f.tell()


@pytest.mark.parametrize("case", range(len(ARRAYS)))
def test_fast_header_equals_numpys(case, monkeypatch):
    buf = io.BytesIO()
    np.save(buf, ARRAYS[case])
    data = buf.getvalue()
    calls = []
    real = np.lib.format.read_array_header_1_0
    monkeypatch.setattr(
        np.lib.format, "read_array_header_1_0", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    f = io.BytesIO(data)
    shape, fortran, dtype = files._read_npy_header(f, "x.npy")
    assert calls == []  # the regex read it
    monkeypatch.undo()
    assert (shape, fortran, dtype, f.tell()) == numpy_header(data)
    assert dtype == ARRAYS[case].dtype and shape == ARRAYS[case].shape


@pytest.mark.parametrize(
    "header",
    [
        b"{'descr': '<i4', 'fortran_order': False, 'shape': (3,), 'extra': 1, }",
        b"{'fortran_order': False, 'descr': '<i4', 'shape': (3,), }",
        b"{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (3,), }",
    ],
)
def test_other_headers_go_to_numpy(header):
    text = header + b" " * (64 - 10 - len(header) % 64 - 1) + b"\n"
    data = b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + b"\0" * 12
    f = io.BytesIO(data)
    try:
        got = files._read_npy_header(f, "x.npy")
    except FormatError as exc:
        with pytest.raises(ValueError):
            numpy_header(data)
        assert "not a .npy file" in str(exc)
    else:
        assert got == numpy_header(data)[:3]


@pytest.mark.parametrize(
    "data", [b"", b"\x93NUMPY", b"\x93NUMPY\x01\x00\x40\x00{'descr'", b"PK\x03\x04" * 20]
)
def test_damaged_headers_are_format_errors(data):
    with pytest.raises(FormatError, match=r"not a \.npy file"):
        files._read_npy_header(io.BytesIO(data), "x.npy")
