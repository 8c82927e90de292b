"""``tokenload explain`` and ``tokenload where`` as a user runs them (issue 35, point 3): the data
flags of ``prepare-cache`` and a saved loader state; what they print is the library's answer
(``tokenload.provenance``), and the text of each piece is its tokens decoded; bad input is one
line and exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from support import run_cli, write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.provenance import explain, where

S, G, TRAIN = 16, 8, 160


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(1)
    prefixes = []
    for name in ("a", "b"):
        docs = [rng.integers(97, 123, size=int(n)) for n in rng.integers(5, 50, size=60)]
        prefixes.append(write_documents(tmp / name, docs))
    state = {
        "consumed_samples": 24,
        "fingerprint": "x",
        "micro_batch_size": 2,
        "dp_size": 2,
        "version": 1,
        "skips": [{"at": 16, "samples": 8, "sources": {}}],
    }
    (tmp / "state.json").write_text(json.dumps(state))
    return tmp, prefixes, state


def flags(tmp, prefixes, order):
    return [
        "--data-path", "1", prefixes[0], "1", prefixes[1], "--split", "100,0,0",
        "--seq-length", S, "--global-batch-size", G, "--micro-batch-size", 2,
        "--train-valid-test-num-samples", TRAIN, 0, 0, "--order", order,
        "--state", tmp / "state.json",
    ]  # fmt: skip


def dataset(prefixes, order):
    cfg = MegatronDataConfig(
        sequence_length=S,
        blend=["1", prefixes[0], "1", prefixes[1]],
        split="100,0,0",
        cache="off",
        order=order,
    )
    return build_datasets(cfg, [TRAIN, 0, 0])[0]


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_explain_and_where_print_the_librarys_answers(data, order):
    tmp, prefixes, state = data
    done = run_cli("explain", "--step", 2, *flags(tmp, prefixes, order), "--text",
                   "--tokenizer", "byte")  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = explain(dataset(prefixes, order), step=2, global_batch_size=G, state=state)
    out = done.stdout.splitlines()[2:]
    lines = [x for x in out if not x.lstrip().startswith("text ")]
    texts = [x.lstrip()[5:] for x in out if x.lstrip().startswith("text ")]
    pieces = [(r, p) for r in rows for p in r.pieces]
    assert len(lines) == len(pieces) == len(texts)
    for line, text, (r, p) in zip(lines, texts, pieces):
        assert f"{p.document:8d}  [{p.start}, {p.stop})" in line
        assert line.split()[0:4] == [
            str(r.rank),
            str(r.micro_batch),
            str(r.row),
            str(r.sample),
        ] or (not line[:24].strip())
        assert len(json.loads(text)) == p.stop - p.start  # one byte per token
    assert rows[0].sample == 3 * G  # step 2 comes after the skip of step 2's samples
    document = rows[0].pieces[0].document
    source = rows[0].pieces[0].source
    done = run_cli("where", "--source", source, "--document", document,
                   *flags(tmp, prefixes, order))  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = where(dataset(prefixes, order), source=source, document=document,
                  global_batch_size=G, state=state)  # fmt: skip
    assert f"{len(found.steps)} steps" in done.stdout and 2 in found.steps
    printed = [tuple(map(int, x.split())) for x in done.stdout.splitlines()[2:] if x[:1] == " "
               or x[:1].isdigit()]  # fmt: skip
    assert [p[0] for p in printed if len(p) == 5] == [s for s, _ in found.rows]


def test_bad_input_is_one_line_and_exit_2(data):
    tmp, prefixes, _ = data
    done = run_cli("where", "--source", 5, "--document", 0, *flags(tmp, prefixes, "computed"))
    assert done.returncode == 2
    assert "source" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("explain", "--step", 0, *flags(tmp, prefixes, "computed")[2:])  # no data
    assert done.returncode == 2 and "Traceback" not in done.stderr
