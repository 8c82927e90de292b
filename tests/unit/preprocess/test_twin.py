"""gigatoken and the native tokenizer loaded at once (``preprocess.twin``): the same tokenizer as
the serial load, no child left behind, and every failure handed to the serial load, which
reports it exactly as before."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

from tokenload.errors import ConfigError
from tokenload.preprocess import TokenizerSpec, load_tokenizer, twin
from tokenload.preprocess.backends import HFTokenizer

TWIN_KINDS = ("bytelevel", "bytelevel_bos", "sp_bpe_json")


@pytest.fixture
def forks(monkeypatch):
    """The pids this process forks while the test runs, in a process left with one thread (an
    earlier test's progress bar leaves tqdm's monitor thread running: it is stopped here)."""
    from tqdm import tqdm

    if tqdm.monitor is not None:
        tqdm.monitor.exit()
        tqdm.monitor = None
    for thread in threading.enumerate():
        if thread.name == "tokenload-reap":  # an earlier test's child, exiting
            thread.join(5)
    others = [t for t in threading.enumerate() if t is not threading.current_thread()]
    if others:
        # Earlier tests in this process leave idle daemon threads (fsspec's event loop, asyncio's
        # executor) that a user's fresh process would not have: the twin load is tested anyway.
        assert all(t.daemon for t in others), others
        monkeypatch.setattr(twin, "_only_thread", lambda: True)
    # likewise the memory the whole suite has accumulated in this process by now
    monkeypatch.setattr(twin, "FORK_RESIDENT_LIMIT", 1 << 40)
    pids: list[int] = []
    real_fork = os.fork

    def fork():
        pid = real_fork()
        if pid:
            pids.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", fork)
    return pids


def reaped(pid: int, seconds: float = 5.0) -> bool:
    """Whether ``pid`` is no longer a child of this process (exited and waited for)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        time.sleep(0.01)
    return False


def spec(path: str, **kw) -> TokenizerSpec:
    return TokenizerSpec(kind="HuggingFaceTokenizer", model=path, **kw)


def serial(s: TokenizerSpec, monkeypatch) -> object:
    with monkeypatch.context() as m:
        m.setattr(twin, "can_fork_for", lambda _spec: False)
        return load_tokenizer(s)


@pytest.mark.parametrize("name", TWIN_KINDS)
def test_twin_load_gives_the_serial_loads_tokenizer(name, tokenizer_files, texts, forks, monkeypatch):
    s = spec(tokenizer_files[name])
    fast = load_tokenizer(s)
    assert len(forks) == 1
    assert reaped(forks[0])
    assert fast.engine == "gigatoken"
    assert isinstance(fast.native, twin.NativeStandIn)
    assert fast.native._real is None  # the native tokenizer was parsed only in the child
    reference = serial(s, monkeypatch)
    assert isinstance(reference.native, HFTokenizer)
    assert fast.identity() == reference.identity()
    assert (fast.vocab_size, fast.eod_id, fast.dtype) == (reference.vocab_size, reference.eod_id, reference.dtype)
    assert fast.prefix.tolist() == reference.prefix.tolist()
    assert fast.suffix.tolist() == reference.suffix.tolist()
    sample = texts[:200]
    got, want = fast.encode_batch(sample), reference.native.encode_batch(sample)
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[0].astype(np.int64), want[0])


def test_stand_in_loads_the_native_encoder_only_when_asked(tokenizer_files, texts, forks):
    fast = load_tokenizer(spec(tokenizer_files["bytelevel_bos"]))
    stand_in = fast.native
    assert isinstance(stand_in, twin.NativeStandIn) and stand_in._real is None
    ids, lengths = stand_in.encode_batch(texts[:20])
    assert isinstance(stand_in._real, HFTokenizer)
    want = stand_in._real.encode_batch(texts[:20])
    assert np.array_equal(ids, want[0]) and np.array_equal(lengths, want[1])


def test_another_thread_alive_means_a_serial_load(tokenizer_files, forks, monkeypatch):
    monkeypatch.setattr(twin, "_only_thread", lambda: threading.active_count() == 1)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        tok = load_tokenizer(spec(tokenizer_files["bytelevel"]))
    finally:
        stop.set()
        other.join()
    assert forks == []
    assert tok.engine == "gigatoken" and isinstance(tok.native, HFTokenizer)


@pytest.mark.parametrize("kind", ["gpt2", "tiktoken", "sentencepiece", "native engine"])
def test_what_is_not_one_tokenizer_json_loads_serially(kind, tokenizer_files, forks):
    specs = {
        "gpt2": TokenizerSpec(
            kind="gpt2", vocab_file=tokenizer_files["gpt2_vocab"], merge_file=tokenizer_files["gpt2_merges"]
        ),
        "tiktoken": TokenizerSpec(kind="tiktoken", model=tokenizer_files["tiktoken"], tiktoken_pattern="gpt2"),
        "sentencepiece": TokenizerSpec(kind="GPTSentencePieceTokenizer", model=tokenizer_files["sp_bpe"]),
        "native engine": spec(tokenizer_files["bytelevel"], engine="native"),
    }
    load_tokenizer(specs[kind])
    assert forks == []


def test_a_child_that_hangs_is_killed_and_the_load_is_serial(tokenizer_files, forks, monkeypatch):
    monkeypatch.setattr(twin, "_native_facts", lambda _spec: time.sleep(60))  # the child inherits it
    monkeypatch.setattr(twin, "CHILD_TIMEOUT", 0.5)
    started = time.monotonic()
    tok = load_tokenizer(spec(tokenizer_files["bytelevel"]))
    assert time.monotonic() - started < 10
    assert len(forks) == 1 and reaped(forks[0], seconds=0.1)
    assert tok.engine == "gigatoken" and isinstance(tok.native, HFTokenizer)


def test_a_child_that_dies_means_a_serial_load(tokenizer_files, forks, monkeypatch):
    monkeypatch.setattr(twin, "_native_facts", lambda _spec: os._exit(3))
    tok = load_tokenizer(spec(tokenizer_files["bytelevel"]))
    assert len(forks) == 1 and reaped(forks[0], seconds=0.1)
    assert isinstance(tok.native, HFTokenizer)


def test_a_garbled_answer_means_a_serial_load(tokenizer_files, forks, monkeypatch):
    monkeypatch.setattr(twin, "_native_facts", lambda _spec: "not the facts")
    tok = load_tokenizer(spec(tokenizer_files["bytelevel"]))
    assert len(forks) == 1
    assert isinstance(tok.native, HFTokenizer)


def test_a_probe_that_differs_in_the_child_leaves_the_verdict_to_the_serial_load(
    tokenizer_files, forks, monkeypatch
):
    real = twin._native_facts

    def wrong(s):
        facts = real(s)
        ids = facts.probe_ids.copy()
        ids[0] += 1
        return twin.NativeFacts(**{**facts.__dict__, "probe_ids": ids})

    monkeypatch.setattr(twin, "_native_facts", wrong)
    tok = load_tokenizer(spec(tokenizer_files["bytelevel"]))
    assert len(forks) == 1
    assert isinstance(tok.native, HFTokenizer)  # proven again in this process, with real ids


@pytest.mark.parametrize(
    "problem, message",
    [
        ("eod", "EOD token '<nope>' is not in the tokenizer's vocabulary"),
        ("json", "cannot load tokenizer.json"),
    ],
)
def test_user_errors_are_reported_as_by_the_serial_load(problem, message, tokenizer_files, tmp_path, forks):
    if problem == "eod":
        s = spec(tokenizer_files["bytelevel"], eod_token="<nope>")
    else:
        (tmp_path / "bad.json").write_text('{"model": {"type": "BPE", "vocab": 7}}')
        s = spec(str(tmp_path / "bad.json"))
    with pytest.raises(ConfigError, match=message):
        load_tokenizer(s)
    assert len(forks) == 1 and reaped(forks[0])


def test_a_large_process_does_not_fork(tokenizer_files, forks, monkeypatch):
    monkeypatch.setattr(twin, "FORK_RESIDENT_LIMIT", 1 << 20)
    tok = load_tokenizer(spec(tokenizer_files["bytelevel"]))
    assert forks == [] and isinstance(tok.native, HFTokenizer)


def test_an_interrupt_while_waiting_stops_the_child(tokenizer_files, forks, monkeypatch):
    monkeypatch.setattr(twin, "_native_facts", lambda _spec: time.sleep(60))

    def interrupted(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(twin.select, "select", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load_tokenizer(spec(tokenizer_files["bytelevel"]))
    assert len(forks) == 1 and reaped(forks[0], seconds=0.1)


def test_preprocess_with_the_defaults_loads_as_twins_and_writes_the_native_bytes(
    tokenizer_files, texts, tmp_path, forks, monkeypatch
):
    from tokenload.preprocess import PreprocessConfig, preprocess

    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:300]), encoding="utf-8")

    def run(out: str, **kw):
        config = PreprocessConfig(
            inputs=(str(data),), output_prefix=str(tmp_path / out), append_eod=True, **kw
        )
        return preprocess(config, progress=False)

    fast = run("fast", tokenizer=spec(tokenizer_files["bytelevel_bos"]))
    assert len(forks) == 1 and fast.engine == "gigatoken"
    native = run("native", tokenizer=spec(tokenizer_files["bytelevel_bos"], engine="native"))
    assert native.engine == "tokenizers"
    for ext in (".bin", ".idx"):
        a = (tmp_path / f"fast_text_document{ext}").read_bytes()
        b = (tmp_path / f"native_text_document{ext}").read_bytes()
        assert a == b and len(a) > 0
