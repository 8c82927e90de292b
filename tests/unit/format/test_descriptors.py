"""Open file descriptors at many prefixes (issue 27): a mapping keeps none, ``pread`` files sit in
a bounded LRU that reopens only the same file, and running out of descriptors says which limit
to raise. The end-to-end case reads a blend of 1,000 prefixes through the loader with workers
under a lowered RLIMIT_NOFILE, in both orders and both read modes."""

from __future__ import annotations

import errno
import gc
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tokenload.errors import StorageError
from tokenload.format import TokenFile, max_open_files, set_max_open_files
from tokenload.format.bin import MmapBin, PreadBin
from tokenload.format.descriptors import DescriptorCache, descriptor_cache, map_readonly
from tokenload.format.idx import encode_index
from tokenload.storage.os_errors import read_error, write_error

DRIVER = Path(__file__).with_name("descriptor_driver.py")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def write_pair(prefix: str, documents: list[np.ndarray]) -> None:
    """A token file pair written directly (no sidecar, no fsync: a thousand of them in a second)."""
    lengths = np.array([len(d) for d in documents], dtype=np.int32)
    with open(prefix + ".bin", "wb") as f:
        f.write(np.concatenate(documents).astype(np.uint16).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(b"".join(encode_index(np.uint16, lengths, np.arange(len(lengths) + 1))))


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(1)
    out = []
    for i in range(40):
        prefix = str(tmp_path / f"f{i:02d}")
        sizes = rng.integers(1, 50, size=8)
        write_pair(prefix, [rng.integers(1, 60000, size=int(n)) for n in sizes])
        out.append(prefix)
    return out


@pytest.fixture
def small_limit():
    before = max_open_files()
    set_max_open_files(4)
    yield 4
    set_max_open_files(before)


def _mapped(path: str) -> int:
    with open("/proc/self/maps") as f:
        return sum(line.rstrip().endswith(path) for line in f)


def test_a_mapping_keeps_no_descriptor_and_is_unmapped_with_its_last_view(files):
    path = files[0] + ".bin"
    fd = os.open(path, os.O_RDONLY)
    before = open_fds()
    array = map_readonly(fd, os.path.getsize(path))
    os.close(fd)
    assert open_fds() == before - 1
    assert bytes(array) == Path(path).read_bytes()
    assert not array.flags.writeable
    view = array.view(np.uint16)[2:5]
    del array
    gc.collect()
    assert _mapped(path) == 1 and view.size == 3  # a view keeps the mapping alive
    del view
    gc.collect()
    assert _mapped(path) == 0


def test_memory_mapped_token_files_hold_no_descriptor(files):
    before = open_fds()
    opened = [TokenFile(p) for p in files]
    got = [f.get(1) for f in opened]
    assert open_fds() == before
    for prefix, tokens in zip(files, got):
        lengths = np.frombuffer(Path(prefix + ".idx").read_bytes()[34 : 34 + 32], np.int32)
        data = np.frombuffer(Path(prefix + ".bin").read_bytes(), np.uint16)
        np.testing.assert_array_equal(tokens, data[lengths[0] : lengths[0] + lengths[1]])


def test_pread_keeps_at_most_the_limit_open_and_reads_right_after_eviction(files, small_limit):
    before = open_fds()
    sources = [PreadBin(p + ".bin", np.uint16) for p in files]
    assert open_fds() - before <= small_limit
    mapped = [MmapBin(p + ".bin", np.uint16) for p in files]
    for _ in range(2):  # the second round reopens every file evicted in the first
        for pread, mmap in zip(sources, mapped):
            starts, lengths = np.array([0, 3, 9]), np.array([2, 4, 1])
            np.testing.assert_array_equal(pread.read_spans(starts, lengths),
                                          mmap.read_spans(starts, lengths))
            np.testing.assert_array_equal(pread.read(1, 5), mmap.read(1, 5))
            assert open_fds() - before <= small_limit
    for source in sources:
        source.close()
    assert open_fds() == before


def test_a_file_replaced_while_evicted_is_an_error_not_other_tokens(files, small_limit):
    victim = PreadBin(files[0] + ".bin", np.uint16)
    others = [PreadBin(p + ".bin", np.uint16) for p in files[1:10]]  # evict the victim's
    assert all(o.read(0, 1).size == 1 for o in others)
    data = Path(files[1] + ".bin").read_bytes()
    tmp = files[0] + ".bin.new"
    Path(tmp).write_bytes(data[: victim.num_bytes].ljust(victim.num_bytes, b"\0"))
    os.replace(tmp, files[0] + ".bin")  # same size, another inode
    with pytest.raises(StorageError, match="changed since it was first opened") as info:
        victim.read(0, 4)
    assert "replaced" in info.value.hint


def test_a_descriptor_in_use_is_not_closed_by_an_eviction(files):
    cache = DescriptorCache(1)
    fds = [os.open(p + ".bin", os.O_RDONLY) for p in files[:2]]
    cache.adopt(0, fds[0])
    entry = cache.acquire(0, lambda: pytest.fail("not evicted yet"))
    cache.adopt(1, fds[1])  # over the limit, but key 0 is pinned: key 1 is the one to go
    os.fstat(entry.fd)
    cache.release(entry)
    assert len(cache) == 1
    cache.discard(0)
    assert len(cache) == 0
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_threads_reading_through_a_small_lru_read_the_right_tokens(files, small_limit):
    sources = [PreadBin(p + ".bin", np.uint16) for p in files]
    truth = [np.frombuffer(Path(p + ".bin").read_bytes(), np.uint16) for p in files]
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(300):
            i = int(rng.integers(len(files)))
            n = sources[i].num_tokens
            start = int(rng.integers(n))
            if not np.array_equal(sources[i].read(start, n - start), truth[i][start:]):
                errors.append(i)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(descriptor_cache()) <= small_limit


def test_too_many_open_files_names_the_limits_to_raise():
    for path_error in (read_error, write_error):
        emfile = OSError(errno.EMFILE, "Too many open files")
        error = path_error(emfile, "/d/p00505.idx", "the index")
        assert "ulimit -n" in error.hint and "TOKENLOAD_OPEN_FILES" in error.hint
        assert "soft limit is" in error.hint
        assert "filesystem is healthy" not in error.hint and "output folder" not in error.hint
    with pytest.raises(ValueError, match="at least 1"):
        set_max_open_files(0)


def test_running_out_of_descriptors_is_a_storage_error_with_that_hint(files):
    code = (
        "import os, resource, sys\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "from tokenload.format import TokenFile\n"
        "from tokenload.errors import StorageError\n"
        "held = []\n"
        "try:\n"
        "    while True: held.append(os.open(os.devnull, os.O_RDONLY))\n"
        "except OSError: pass\n"
        "try:\n"
        "    TokenFile(sys.argv[1]).num_tokens\n"
        "except StorageError as e:\n"
        "    print(e.hint)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, files[0]], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "soft limit is 64" in out.stdout and "ulimit -n" in out.stdout


@pytest.fixture(scope="module")
def thousand(tmp_path_factory):
    folder = tmp_path_factory.mktemp("thousand")
    rng = np.random.default_rng(0)
    for i in range(1000):
        write_pair(str(folder / f"p{i:05d}"),
                   [rng.integers(1, 1000, size=int(n)) for n in rng.integers(5, 40, size=20)])
    return folder


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("order", "mode", "lru"), [
    ("computed", "mmap", None), ("computed", "pread", 32), ("megatron", "mmap", None),
    ("megatron", "pread", None),
])
def test_a_thousand_prefixes_read_under_a_low_descriptor_limit(thousand, order, mode, lru):
    """1,000 prefixes, 2 workers, RLIMIT_NOFILE 256 (each process): the loader delivers 40
    micro-batches equal to the dataset's own, and no process holds more than its base descriptors
    plus the pread LRU, whatever the number of prefixes it touched."""
    env = dict(os.environ)
    env.pop("TOKENLOAD_OPEN_FILES", None)
    if lru is not None:
        env["TOKENLOAD_OPEN_FILES"] = str(lru)
    out = subprocess.run(
        [sys.executable, str(DRIVER), str(thousand), "1000", order, mode, "256", "2", "40"],
        capture_output=True, text=True, timeout=170, env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["batches"] == 40 and result["same"]
    bound = 40 + (0 if mode == "mmap" else (lru or 128))
    for count in result["counts"]:
        assert len(count["workers"]) == 2
        assert max(count["main"], *count["workers"]) <= bound, count
