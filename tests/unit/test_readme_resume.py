"""README's "Resuming, on any number of ranks" sample runs as written (a new user found no
recipe for an elastic resume in the docs): saved on 4 ranks of micro-batch 2, loaded on 2 ranks
of micro-batch 4, the 2 ranks read what the 4 would have read next, together."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np

from support import write_documents

README = Path(__file__).resolve().parents[2] / "README.md"


def _sample() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("### Resuming, on any number of ranks", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, "README's resume section has no Python sample"
    return found.group(1)


def test_the_readme_resume_sample_continues_the_stream_on_other_ranks(tmp_path):
    rng = np.random.default_rng(5)
    docs = [rng.integers(1, 900, size=int(n)) for n in rng.integers(5, 120, size=400)]
    prefix = write_documents(tmp_path / "c", docs)
    code = _sample()
    assert "state_dict()" in code and "load_state_dict(state)" in code
    code = code.replace('"out/c_text_document"', repr(str(prefix)))
    code = code.replace("sequence_length=2048", "sequence_length=16").replace("[8000, 0, 0]", "[400, 0, 0]")
    code = code.replace("\n...", "\n_train(loader)")
    before, after = code.split("\nresumed = ", 1)
    after = "resumed = " + after
    steps = 5
    states = []
    for rank in range(4):  # the 4 ranks of the first run, up to the checkpoint
        env = {"rank": rank, "_train": lambda loader: list(itertools.islice(loader, steps))}
        exec(before, env)
        states.append(env["state"])
    def shared(state):
        return {k: v for k, v in state.items() if k != "metrics"}

    assert all(shared(s) == shared(states[0]) for s in states)  # "ranks differ only in metrics"
    seen = []
    for rank in range(2):  # the 2 ranks of the resumed run
        env = {**env, "rank": rank, "state": states[rank]}
        exec(after, env)
        seen.append([b["tokens"].numpy() for b in itertools.islice(env["resumed"], 2)])
    from tokenload.datasets import MegatronDataConfig, build_datasets
    from tokenload.loader import build_dataloader

    train, _, _ = build_datasets(MegatronDataConfig(sequence_length=16, blend=[str(prefix)], split="100,0,0",
                                                    packing="best-fit"), [400, 0, 0])
    one = build_dataloader(train, micro_batch_size=8, dp_rank=0, dp_size=1)  # the global batch
    global_batches = [b["tokens"].numpy() for b in itertools.islice(one, steps + 2)][steps:]
    for step, whole in enumerate(global_batches):  # rank r of 2 reads samples r*4 .. r*4+3
        np.testing.assert_array_equal(np.concatenate([seen[0][step], seen[1][step]]), whole)
