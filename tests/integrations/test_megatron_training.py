"""tokenload's Megatron adapter against megatron-core 0.19.2's own ``megatron.training``.

megatron.training needs Python 3.12 and megatron-core, which the main test venv need not have:
the checks (``megatron_checks.py``) run under the Python named by ``TOKENLOAD_MEGATRON_PYTHON``
(``bash .ci/megatron-venv.sh`` makes it), as real processes joined by gloo through torchrun.
Without that variable these tests skip on a developer's machine and fail under ``CI=true``.

What needs CUDA, and is therefore replaced here by the functions beneath it (megatron-core
0.19.2): ``pretrain()``; ``initialize_megatron`` (asserts CUDA; without devices it skips
``mpu.initialize_model_parallel``, and rank 0's ``compile_helpers`` runs ``make`` in the wheel's
datasets folder, which has no Makefile) -> gloo and ``initialize_model_parallel`` here, globals
from ``parse_and_validate_args``; ``build_train_valid_test_data_loaders`` (broadcasts its
do-train/valid/test flags as a CUDA tensor) -> ``build_train_valid_test_datasets`` +
``build_pretraining_data_loader`` + the iterator wrapping of
``build_train_valid_test_data_iterators``; pretrain_gpt.py's ``get_batch`` /
``get_batch_on_this_tp_rank`` (``.cuda()``, tensor-parallel broadcast) -> the batch fields are
compared instead; ``train_step``/``evaluate`` -> their data arithmetic
(``get_num_microbatches()`` micro-batches, ``consumed_*_samples`` increments);
``save_checkpoint``/``load_checkpoint`` (need a model and optimizer) -> ``args`` saved with
``torch.save`` and ``load_checkpoint``'s two lines restoring the consumed samples. A GPU run checks
them by training a 2-layer GPT with the changed and the unchanged pretrain_gpt.py on the same
flags (``--deterministic-mode``): the same ``lm loss`` at every iteration; then ``--save`` on 2
GPUs and ``--load`` on 4 (DP 4, and TP 2 x DP 2), the loss continuing as the uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from megatron_boundaries import compare

pytestmark = pytest.mark.timeout(600)

CHECKS = Path(__file__).with_name("megatron_checks.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def megatron_python() -> str:
    python = os.environ.get("TOKENLOAD_MEGATRON_PYTHON")
    if not python or not os.access(python, os.X_OK):
        message = (f"TOKENLOAD_MEGATRON_PYTHON is {python!r}, not a Python with megatron-core"
                   " 0.19.2; make one with: eval \"$(bash .ci/megatron-venv.sh | tail -1)\"")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return python


def run_checks(python: str, ranks: int, *args: str, timeout: float = 300) -> dict:
    """``megatron_checks.py ARGS`` on ``ranks`` torchrun processes; rank 0's RESULT line."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO / "src")
    cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           str(CHECKS), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=REPO, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its ranks
        proc.communicate()
        raise
    results = [line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and results, f"{' '.join(args)} failed:\n{out[-6000:]}"
    return json.loads(results[-1])


def test_batches_equal_megatrons_gpt_dataset_path(megatron_python, tmp_path):
    """Megatron's parser, sample counts, build_train_valid_test_datasets and
    build_pretraining_data_loader: tokenload's provider gives the same micro-batches as
    pretrain_gpt.py's GPTDataset path for the same args, resumed mid-way (consumed samples as a
    checkpoint restores them), until both end."""
    report = run_checks(megatron_python, 1, "parity", str(tmp_path))
    assert "--dataloader-type single" in report.pop("refused")
    assert set(report) == {"one-prefix", "weighted-blend", "per-split", "mock", "cyclic",
                           "inter-document", "inter-document-no-eod", "mock-inter-document"}
    base = {"tokens", "labels", "loss_mask", "position_ids"}
    fields = {"one-prefix": base | {"attention_mask"},
              "weighted-blend": base | {"attention_mask", "dataset_id"},
              "per-split": base, "mock": base | {"attention_mask"},
              "cyclic": base | {"attention_mask"},
              "inter-document": base | {"cu_seqlens", "max_seqlen"},
              # --reset-position-ids --eod-mask-loss on documents without a trailing EOD: the
              # boundaries are the documents' lengths (issue 33: a boundary at token 59 was
              # missing when they came from EOD tokens)
              "inter-document-no-eod": base | {"cu_seqlens", "max_seqlen"},
              "mock-inter-document": base | {"cu_seqlens", "max_seqlen"}}
    for name, entry in report.items():
        assert set(entry["fields"]) == fields[name], name
        # Megatron's arithmetic: 12 x 8, (12 // 4 + 1) x 2 x 8, 2 x 8
        assert entry["sizes"] == [96, 64, 16]
        # train from consumed 16 (micro-batches of 2 on one rank): at least the 80 samples asked
        assert entry["train"] >= 40 and entry["valid"] >= 28 and entry["test"] >= 8, name
        # metrics to Megatron's W&B writer at every iteration (--tensorboard-log-interval 1)
        steps = entry["wandb_steps"]  # from iteration 3 (consumed 24) to the end of the order
        assert len(steps) >= 10 and steps == list(range(3, 3 + len(steps))), name
        assert entry["wandb_consumed"] == [8.0 * s for s in steps], name
        if "mock" not in name:  # the same cache names: Megatron's tokenizer identity is used
            assert set(entry["megatron_cache"]) <= set(entry["tokenload_cache"]), name
            assert len(entry["megatron_cache"]) >= 12, name


def test_cu_seqlens_are_accepted_by_megatron_trainings_get_batch_path(megatron_python, tmp_path):
    """The provider's batches (documents without a trailing EOD, micro-batches of 2) through
    megatron.training's dummy_train_step (get_batch_on_this_tp_rank with has_cu_seqlens,
    get_batch_on_this_cp_rank) and flatten_batch_for_packed_sequences into
    PackedSeqParams(qkv_format="thd"): every merged cu_seqlens is the rows' boundaries joined."""
    report = run_checks(megatron_python, 1, "thd", str(tmp_path))
    assert report["micro_batches"] == 12  # 3 iterations x 4 micro-batches
    assert report["documents"] > report["micro_batches"] * 2  # rows of several documents
    assert report["fields"] == ["cu_seqlens", "labels", "loss_mask", "max_seqlen", "position_ids",
                                "tokens"]


def test_boundaries_equal_a_fresh_megatron_core_run(megatron_python, tmp_path):
    """tests/fixtures/megatron/make_boundaries.py run now by megatron-core 0.19.2 (three corpora:
    EOD at every document's end, none, EOD ids inside; empty documents, padded last validation
    samples, with and without the extra token, a blend), side by side with tokenload's Megatron
    order on the same token files: every field of every sample equal."""
    out = tmp_path / "fixtures"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([megatron_python, str(REPO / "tests/fixtures/megatron/make_boundaries.py"),
                           str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = compare(out, tmp_path / "cache")
    assert seen["samples"] > 1000 and seen["eod_rule_differs"] > 100 and seen["padded"] > 0


def test_resume_on_two_then_four_ranks_is_exact(megatron_python, tmp_path):
    """A run on 2 gloo ranks stops after 4 iterations; its checkpoint (Megatron's args with
    consumed_train/valid_samples) resumes on 4 ranks for 6 more: every train and valid sample of
    the 10 iterations is served once, equal to Megatron's GPTDataset at that index. The last rank
    holds Megatron's TensorBoard writer, and the loader's metrics are in its event files."""
    work = str(tmp_path)
    run_checks(megatron_python, 2, "run", work, "p1", "--iters", "4")
    run_checks(megatron_python, 4, "run", work, "p2", "--iters", "6",
               "--load", str(tmp_path / "p1.ckpt"))
    report = run_checks(megatron_python, 1, "verify", work, "p1", "p2")
    assert report["train"] == 10 * 16  # 10 iterations x global batch 16, none twice, none skipped
    assert report["valid"] == 3 * 1 * 16  # evaluations at 3, 6, 9 of --eval-iters 1
    tb = report["tensorboard"]
    # every --tensorboard-log-interval (2) iterations, at step consumed // global batch
    assert dict(tb["tokenload/consumed-samples"]) == {s: 16.0 * s for s in (2, 4, 6, 8, 10)}
    per_source = [t for t in tb if t.startswith("tokenload/source/") and t.endswith("/tokens")]
    assert len(per_source) == 2
    for step, tokens in tb["tokenload/tokens"]:
        assert tokens == sum(dict(tb[t])[step] for t in per_source)
    for tag in ("data-wait-share", "data-wait-mean-ms", "samples-per-s", "tokens-per-s"):
        assert f"tokenload/{tag}" in tb
