"""`tokenload doctor` says which index caches Megatron wrote (no tokenload sidecar) and what is
then checked of them: a GPT cache against the token files' lengths, a blend's by sizes only."""

from __future__ import annotations

import glob
import os

import numpy as np

from support import run_cli, write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets

FAST = ("--split", "100,0,0", "--seq-length", "64", "--steps", "3", "--train-samples", "200")


def _corpus(prefix, seed):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 250, rng.integers(20, 400)) for _ in range(300)]
    return write_documents(prefix, docs)


def test_doctor_names_caches_without_a_sidecar_and_what_is_checked_of_them(tmp_path):
    a, b = _corpus(tmp_path / "a", 0), _corpus(tmp_path / "b", 1)
    cache = tmp_path / "cache"
    blend = [a, b]  # no weights: the doctor sizes only the train split
    config = MegatronDataConfig(sequence_length=64, blend=blend, split="100,0,0",
                                path_to_cache=str(cache))
    build_datasets(config, [200, None, None])
    args = ("doctor", "--data-path", *blend, "--data-cache-path", cache, "--build-policy", "none",
            *FAST)
    hashed = run_cli(*args)
    prepared = "[startup] ok: the index caches are prepared"
    assert prepared in hashed.stdout, hashed.stdout + hashed.stderr
    assert "[cache-trust]" not in hashed.stdout  # tokenload's caches: sidecars with hashes

    for sidecar in glob.glob(str(cache / "*-tokenload.json")):
        os.remove(sidecar)  # as Megatron writes them
    out = run_cli(*args)
    assert "[startup] ok: the index caches are prepared" in out.stdout, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("[cache-trust]")]
    gpt = ("2 index cache(s) written by Megatron", "checked against the sequence lengths")
    assert any(all(part in x for part in gpt) for x in lines), out.stdout
    blend_line = ("cache written by Megatron: its match with the current token files is checked by"
                  " sizes only")
    assert any(blend_line in x for x in lines), out.stdout
