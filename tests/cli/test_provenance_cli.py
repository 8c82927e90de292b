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
from tokenload.loader import build_dataloader
from tokenload.provenance import explain, where

S, G, TRAIN = 16, 8, 160


def saved_state(dataset, steps, skip_after=None):
    """A real loader's state (2 ranks, micro-batch 2: rank 0's) after ``steps`` global steps,
    with a skip of one global step after step ``skip_after``."""
    loader = build_dataloader(dataset, micro_batch_size=2, dp_rank=0, dp_size=2, num_workers=0)
    batches = iter(loader)
    for step in range(steps):
        if step == skip_after:
            loader.skip(samples=G)
        for _ in range(2):
            next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return state


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(1)
    prefixes = []
    for name in ("a", "b"):
        docs = [rng.integers(97, 123, size=int(n)) for n in rng.integers(5, 50, size=60)]
        prefixes.append(write_documents(tmp / name, docs))
    states = {}
    for order in ("computed", "megatron"):
        states[order] = saved_state(dataset(prefixes, order), 3, skip_after=2)
        assert [s["samples"] for s in states[order]["skips"]] == [G]
        (tmp / f"state-{order}.json").write_text(json.dumps(states[order]))
    return tmp, prefixes, states


def flags(tmp, prefixes, order):
    return [
        "--data-path", "1", prefixes[0], "1", prefixes[1], "--split", "100,0,0",
        "--seq-length", S, "--global-batch-size", G, "--micro-batch-size", 2,
        "--train-valid-test-num-samples", TRAIN, 0, 0, "--order", order,
        "--state", tmp / f"state-{order}.json",
        "--no-create-attention-mask-in-dataloader",  # the Python config's default, in flags
    ]  # fmt: skip


def dataset(prefixes, order, **options):
    cfg = MegatronDataConfig(
        sequence_length=S,
        blend=["1", prefixes[0], "1", prefixes[1]],
        split="100,0,0",
        cache="off",
        order=order,
        **options,
    )
    return build_datasets(cfg, [TRAIN, 0, 0])[0]


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_explain_and_where_print_the_librarys_answers(data, order):
    tmp, prefixes, states = data
    state = states[order]
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
    odd = flags(tmp, prefixes, "computed")  # G = 8 on 2 ranks of 3: the ranks the user gave
    odd[odd.index("--micro-batch-size") + 1] = 3
    at = odd.index("--train-valid-test-num-samples")  # Megatron's arithmetic checks it first
    odd[at : at + 4] = ["--train-samples", TRAIN, "--eval-iters", 0, "--eval-interval", 10]
    done = run_cli("explain", "--step", 0, *odd, "--data-parallel-size", 2)
    assert done.returncode == 2
    assert "micro batch size 3 x data-parallel size 2" in done.stderr, done.stderr
    # red-team findings: a tokenizer file that is none, and a state whose skips are damaged,
    # ended in tracebacks (the Rust library's plain Exception; a KeyError/TypeError/ValueError
    # read before the loader's own check of the state)
    for tokenizer in (tmp / "missing.json", prefixes[0] + ".idx"):
        done = run_cli("explain", "--step", 2, *flags(tmp, prefixes, "computed"), "--text",
                       "--tokenizer", tokenizer)  # fmt: skip
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "is not a readable tokenizer.json" in done.stderr
    state = json.loads((tmp / "state-computed.json").read_text())
    for damaged in ([{"at": "x", "samples": 8, "sources": {}}], 5, [{"samples": 8, "sources": {}}], [[0, 8]]):
        (tmp / "damaged.json").write_text(json.dumps({**state, "skips": damaged}))
        for command in (["explain", "--step", 1], ["where", "--source", 0, "--document", 1]):
            args = [*flags(tmp, prefixes, "computed")[:-3], "--state", tmp / "damaged.json",
                    "--no-create-attention-mask-in-dataloader"]  # fmt: skip
            done = run_cli(*command, *args)
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
            assert "loader state 'skips' is malformed" in done.stderr


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_packed_rows_are_answered_with_packing_and_a_packed_state_refused_without(
    data, tmp_path, order
):
    _, prefixes, _ = data
    packed = {"packing": "best-fit", "max_documents_per_row": 3, "inter_document_masking": True}
    state = saved_state(dataset(prefixes, order, **packed), 3)
    (tmp_path / f"state-{order}.json").write_text(json.dumps(state))
    cache = tmp_path / "cache"
    cache.mkdir()
    base = [*flags(tmp_path, prefixes, order)]
    base += ["--data-cache-path", cache] if order == "megatron" else []  # the computed: none
    job = ["--packing", "best-fit", "--max-documents-per-row", 3,
           "--dataloader-inter-document-masking"]  # fmt: skip
    rows = explain(dataset(prefixes, order, **packed), step=1, global_batch_size=G, state=state)
    assert any(len(r.pieces) > 1 for r in rows)  # packed rows: several documents in some
    _explain_and_where(rows, 1, [*base, *job])
    document = rows[0].pieces[0].document
    others = (
        ([], "--packing concat"),  # concatenated samples
        (job[:2] + job[4:], "--packing best-fit"),  # no cap
        (job[:4], "items with no EOD id and no item option"),  # no inter-document masking
    )
    for other, words in others:
        for command in (["explain", "--step", 1], ["where", "--document", document]):
            done = run_cli(*command, *base, *other)
            assert done.returncode == 2 and "Traceback" not in done.stderr
            assert "state" in done.stderr and words in done.stderr, done.stderr
            assert "`" not in done.stderr  # the fields written as flags
            # the saved run's reading flags, as this command takes them (not a training script's
            # consumed_samples)
            read = f"read with: --order {order} --packing best-fit --seq-length"
            assert read in done.stderr and "--dataloader-inter-document-masking" in done.stderr
            assert "consumed_samples" not in done.stderr
    assert list(cache.iterdir()) == []  # the queries only read the cache folder


def test_a_cap_without_packing_is_refused_in_flags(data):
    tmp, prefixes, _ = data
    done = run_cli("explain", "--step", 0, *flags(tmp, prefixes, "megatron"),
                   "--max-documents-per-row", 3)  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "--packing best-fit" in done.stderr and "packing=" not in done.stderr


def test_where_says_what_the_state_cannot_answer_and_refuses_a_document_past_the_file(
    data, tmp_path
):
    _, prefixes, states = data
    # the run served 3 steps of blend 1:1, then resumed on blend 1:3 (a new mixture chain)
    loader = build_dataloader(dataset(prefixes, "computed"), micro_batch_size=2, dp_rank=0,
                              dp_size=2, num_workers=0)  # fmt: skip
    batches = iter(loader)
    for _ in range(6):
        next(batches)
    weighted = ["--data-path", "1", prefixes[0], "3", prefixes[1]]
    other = MegatronDataConfig(sequence_length=S, blend=weighted[1:], split="100,0,0",
                               cache="off", order="computed")  # fmt: skip
    resumed = build_dataloader(build_datasets(other, [TRAIN, 0, 0])[0], micro_batch_size=2,
                               dp_rank=0, dp_size=2, num_workers=0)  # fmt: skip
    resumed.load_state_dict(loader.state_dict())
    loader.close()
    batches = iter(resumed)
    for _ in range(2):
        next(batches)
    (tmp_path / "state-computed.json").write_text(json.dumps(resumed.state_dict()))
    resumed.close()
    base = flags(tmp_path, prefixes, "computed")
    base[1:5] = weighted[1:]
    done = run_cli("where", "--source", 0, "--document", 1, *base)
    assert done.returncode == 0, done.stderr
    notes = [x for x in done.stdout.splitlines() if x.startswith("note: ")]
    assert len(notes) == 1 and "steps before 3 (global samples before 24) are not covered" in notes[0]
    assert "(from global sample 24 on)" in done.stdout.splitlines()[0]
    # a state of an older tokenload (no topology history): the steps, their ranks unknown
    old = {k: v for k, v in states["computed"].items() if k != "topologies"}
    (tmp_path / "state-computed.json").write_text(json.dumps(old))
    base = flags(tmp_path, prefixes, "computed")
    first = explain(dataset(prefixes, "computed"), step=0, global_batch_size=G, micro_batch_size=2,
                    dp_size=2)  # fmt: skip
    document = first[0].pieces[0].document
    done = run_cli("where", "--source", first[0].pieces[0].source, "--document", document, *base)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(x.split()[:4] == ["0", "?", "?", "?"] for x in lines), done.stdout
    assert any(x.startswith("note: ") and "only from global sample 32" in x for x in lines)
    done = run_cli("explain", "--step", 0, *base)
    assert done.returncode == 2 and "only from global sample 32" in done.stderr
    done = run_cli("explain", "--step", 0, *base, "--data-parallel-size", 2)  # both sizes given
    assert done.returncode == 0, done.stderr
    # a document past the token file (60 documents): one line, exit 2
    done = run_cli("where", "--source", 1, "--document", 60, *base)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "holds 60 documents" in done.stderr and "numbered 0..59" in done.stderr


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_a_batch_schedule_is_taken_for_the_global_batch(data, order):
    """A job with megatron-core's --step-batch-size-schedule (no --global-batch-size, which
    megatron-core refuses with it): its steps are the schedule's, as the library answers them
    (8 samples a step, 16 once 16 are received: tokens // --seq-length)."""
    from tokenload.megatron_args import StepBatchSchedule

    tmp, prefixes, states = data
    schedule = flags(tmp, prefixes, order)
    at = schedule.index("--global-batch-size")
    schedule[at : at + 2] = ["--step-batch-size-schedule", f"0:{G} {2 * G * S}:{2 * G}"]
    at = schedule.index("--train-valid-test-num-samples")
    schedule[at : at + 4] = ["--train-samples", TRAIN, "--eval-iters", 0, "--eval-interval", 10]
    steps = StepBatchSchedule.parse(f"0:{G} {2 * G * S}:{2 * G}", S)
    for step in (1, 3):
        done = run_cli("explain", "--step", step, *schedule)
        assert done.returncode == 0, done.stderr
        rows = explain(dataset(prefixes, order), step=step, global_batch_size=steps,
                       state=states[order])  # fmt: skip
        assert done.stdout.splitlines()[0] == f"step {step}: {len(rows)} rows"
        assert len(rows) == (G if step == 1 else 2 * G)
        firsts = [x.split()[3] for x in done.stdout.splitlines()[2:] if x[:24].strip()]
        assert firsts == [str(r.sample) for r in rows]
    with_sizes = [*schedule[:at], "--train-valid-test-num-samples", TRAIN, 0, 0,
                  *schedule[at + 2 :]]  # fmt: skip
    refused = run_cli("explain", "--step", 1, *with_sizes)
    assert refused.returncode == 2 and "both give the sizes" in refused.stderr


#: A tokenizer identity as Megatron writes it into its descriptions (the job's cache names and
#: its loader state's fingerprint hold it).
IDENTITY = {"class": "megatron.core.tokenizers.text.models.default_tokenizer.DefaultTokenizerText",
            "tokenizer_path": None, "vocab_size": "256"}  # fmt: skip


def test_a_state_saved_over_a_tokenizer_identity_is_answered_with_the_tokenizer_flags(data, tmp_path):
    """explain and where took the data flags of prepare-cache but not its tokenizer flags: a
    state saved by a job whose dataset names a tokenizer (its fingerprint holds it) was always
    refused, and --tokenizer-type was answered 'did you mean --tokenizer?' (the --text decoder's
    flag)."""
    _, prefixes, _ = data
    named = dataset(prefixes, "megatron", tokenizer=IDENTITY)
    state = saved_state(named, 3, skip_after=2)
    (tmp_path / "state-megatron.json").write_text(json.dumps(state))
    base = flags(tmp_path, prefixes, "megatron")
    tokenizer = ["--tokenizer-identity", json.dumps(IDENTITY)]
    rows = explain(named, step=2, global_batch_size=G, state=state)
    _explain_and_where(rows, 2, [*base, *tokenizer])
    document = rows[0].pieces[0].document
    other = {**IDENTITY, "vocab_size": "512"}
    for given in ([], ["--tokenizer-identity", json.dumps(other)]):  # none, or another one
        for command in (["explain", "--step", 2], ["where", "--document", document]):
            done = run_cli(*command, *base, *given)
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
            assert "state" in done.stderr and "did you mean" not in done.stderr, done.stderr


def test_null_tokenizer_flags_give_the_identity_of_the_jobs_state(data, tmp_path):
    """--tokenizer-type NullTokenizer --vocab-size N, as prepare-cache derives its identity."""
    from tokenload import megatron_args

    _, prefixes, _ = data
    null = {"class": megatron_args.NULL_TOKENIZER_CLASS, "tokenizer_path": None, "vocab_size": "256",
            "pad_id": "-1"}  # fmt: skip
    state = saved_state(dataset(prefixes, "megatron", tokenizer=null), 2)
    (tmp_path / "state-megatron.json").write_text(json.dumps(state))
    base = flags(tmp_path, prefixes, "megatron")
    done = run_cli("explain", "--step", 1, *base, "--tokenizer-type", "NullTokenizer", "--vocab-size", 256)
    assert done.returncode == 0, done.stderr
    done = run_cli("explain", "--step", 1, *base, "--tokenizer-type", "NullTokenizer")
    assert done.returncode == 2 and "needs --vocab-size" in done.stderr, done.stderr
    tmp, _, _ = data  # the computed order reads no tokenizer identity: the flags change nothing
    done = run_cli("explain", "--step", 1, *flags(tmp, prefixes, "computed"), "--tokenizer-type", "NullTokenizer",
                   "--vocab-size", 256)  # fmt: skip
    assert done.returncode == 0, done.stderr


def _explain_and_where(rows, step: int, args: list) -> None:
    """``tokenload explain --step STEP ARGS`` prints the pieces of ``rows`` (the library's
    ``explain``), and ``tokenload where`` finds the first one's document at that step."""
    done = run_cli("explain", "--step", step, *args)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()[2:]
    assert len(printed) == sum(len(r.pieces) for r in rows)
    for line, p in zip(printed, [p for r in rows for p in r.pieces]):
        assert f"{p.document:8d}  [{p.start}, {p.stop})" in line
    source, document = rows[0].pieces[0].source, rows[0].pieces[0].document
    done = run_cli("where", "--source", source, "--document", document, *args)
    assert done.returncode == 0, done.stderr
    assert any(x.split()[:1] == [str(step)] for x in done.stdout.splitlines()[2:])  # it holds it
