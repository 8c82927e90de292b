"""`tokenload doctor`: each finding provoked by its condition, checked with its advice, as a real
command; the fix, applied, makes the finding go away."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest

from support import run_cli, run_shell, write_documents
from tokenload.doctor import READ_DELAY_ENV

FAST = ("--split", "100,0,0", "--seq-length", "64", "--steps", "6")


def _corpus(prefix, documents=400, seed=0):
    rng = np.random.default_rng(seed)
    return write_documents(prefix, [rng.integers(0, 250, rng.integers(20, 400)) for _ in range(documents)])


def _finding(stdout: str, check: str) -> str:
    """The finding line of ``check`` and its fix line, if any."""
    match = re.search(rf"^\[{check}\] .*(\n    fix: .*)?", stdout, re.M)
    assert match, stdout
    return match.group(0)


def test_no_cache_under_rank0_is_a_startup_stall_and_its_prepare_command_fixes_it(tmp_path):
    prefix = _corpus(tmp_path / "data")
    cache = tmp_path / "cache"
    out = run_cli("doctor", "--data-path", prefix, "--data-cache-path", cache, "--build-policy", "rank0",
                  "--train-samples", "200", *FAST)
    assert out.returncode == 1, out.stderr
    stall = _finding(out.stdout, "startup")
    assert (
        "PROBLEM: no prepared index cache" in stall
        and "rank 0 builds every index while every other rank waits" in stall
    )
    assert 'build_policy="none"' in stall and 'order="computed"' in stall
    assert "PROBLEM" in _finding(out.stdout, "io-burst") and "sequences JSON" in _finding(out.stdout, "io-burst")
    assert not cache.exists()  # measuring wrote nothing
    command = re.search(r"fix: run `(mkdir -p [^`]* && tokenload prepare-cache [^`]*)`", stall).group(1)
    prepared = run_shell(command)
    assert prepared.returncode == 0, prepared.stderr
    sequences = tmp_path / "sequences.json"
    assert run_cli("sequences", "--data-path", prefix, "--per-dataset-sequences-path", sequences).returncode == 0
    after = run_cli("doctor", "--data-path", prefix, "--data-cache-path", cache, "--build-policy", "none",
                    "--sequences-path", sequences, "--train-samples", "200", *FAST)
    assert "[startup] ok: the index caches are prepared" in after.stdout, after.stdout + after.stderr


def test_a_prepared_cache_with_a_sequences_json_loads_without_a_burst(tmp_path):
    from tokenload.datasets import MegatronDataConfig, build_datasets

    prefix = _corpus(tmp_path / "data")
    cache, sequences = tmp_path / "cache", tmp_path / "sequences.json"
    config = MegatronDataConfig(sequence_length=64, blend=[prefix], split="100,0,0", path_to_cache=str(cache))
    build_datasets(config, [200, None, None])  # rank 0 of one process writes the caches and the manifest
    assert run_cli("sequences", "--data-path", prefix, "--per-dataset-sequences-path", sequences).returncode == 0
    out = run_cli("doctor", "--data-path", prefix, "--data-cache-path", cache, "--build-policy", "none",
                  "--sequences-path", sequences, "--train-samples", "200", *FAST)
    assert "[startup] ok: the index caches are prepared" in out.stdout, out.stdout + out.stderr
    assert "[io-burst] ok: 2 opens and 0 stats per rank in build_datasets: no burst" in out.stdout, out.stdout


def test_slow_storage_is_a_slow_steady_state(tmp_path):
    prefix = _corpus(tmp_path / "data")
    out = run_cli("doctor", "--data-path", prefix, "--order", "computed", *FAST, env={READ_DELAY_ENV: "40"})
    assert out.returncode == 1, out.stderr
    slow = _finding(out.stdout, "steady-state")
    assert "PROBLEM" in slow and "reading the data is the bottleneck" in slow
    assert "loader workers" in slow and "read mode" in slow
    assert "[startup] ok: the computed order starts" in out.stdout
    # the control, the same data read at full speed, is not flagged: a measurement, so another
    # job's burst on a shared machine may slow one run (CI once read 5,308 samples/s against
    # 26,545 of mock data); three tries, not a threshold moved
    for _ in range(3):
        quick = run_cli("doctor", "--data-path", prefix, "--order", "computed", *FAST)
        if "[steady-state] ok" in quick.stdout:
            break
    assert "[steady-state] ok" in quick.stdout, quick.stdout + quick.stderr


def test_two_hundred_tiny_prefixes_are_advised_to_merge(tmp_path):
    rng = np.random.default_rng(1)
    prefixes = [
        write_documents(tmp_path / f"p{i:03d}", [rng.integers(0, 250, 80) for _ in range(4)])
        for i in range(200)
    ]
    out = run_cli("doctor", "--data-path", *prefixes, "--order", "computed", *FAST)
    assert out.returncode == 1, out.stderr
    many = _finding(out.stdout, "prefixes")
    assert "PROBLEM: 200 prefix(es)" in many and "200 under 10 GB" in many
    assert "tokenload merge" in many and "at least 10 GB per file" in many


def test_copies_that_differ_are_named(tmp_path):
    (tmp_path / "node0").mkdir()
    (tmp_path / "node1").mkdir()
    (tmp_path / "node2").mkdir()
    a = _corpus(tmp_path / "node0" / "corpus", seed=0)
    b = _corpus(tmp_path / "node1" / "corpus", seed=1)  # same name and shape, other tokens
    for suffix in (".bin", ".idx"):
        shutil.copy(a + suffix, tmp_path / "node2" / f"corpus{suffix}")
    out = run_cli("doctor", "--data-path", a, b, "--order", "computed", *FAST)
    assert out.returncode == 1, out.stderr
    differ = _finding(out.stdout, "copies")
    assert "PROBLEM" in differ and "copies that differ: corpus:" in differ and a in differ and b in differ
    assert "rsync -c" in differ
    same = run_cli("doctor", "--data-path", a, "--compare", tmp_path / "node2", "--order", "computed", *FAST)
    assert "[copies] ok: 1 file name(s) present in 2 copies: identical content" in same.stdout, same.stdout


def test_plot_is_a_png_of_the_expected_size_and_not_blank(tmp_path):
    from matplotlib import image

    prefix = _corpus(tmp_path / "data")
    png = tmp_path / "doctor.png"
    out = run_cli("doctor", "--data-path", prefix, "--plot", png, *FAST)
    assert out.returncode in (0, 1) and f"plot written to {png}" in out.stdout, out.stderr
    pixels = image.imread(png)
    assert pixels.shape[:2] == (600, 1000)
    assert pixels[..., :3].std() > 0.05  # bars, lines and text, not one colour


def test_plot_without_matplotlib_names_the_extra(tmp_path):
    blocker = tmp_path / "blocker" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('matplotlib is absent here')\n")
    prefix = _corpus(tmp_path / "data")
    out = run_cli("doctor", "--data-path", prefix, "--plot", tmp_path / "x.png", *FAST,
                  env={"PYTHONPATH": str(tmp_path / "blocker")})
    assert out.returncode == 2
    assert "pip install '.[plot]'" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "x.png").exists()


def test_packing_is_advised_when_concatenation_cuts_documents_and_not_once_packed(tmp_path):
    # documents of 20-400 tokens at S = 64: concatenation cuts most of those that fit a row
    prefix = _corpus(tmp_path / "data")
    out = run_cli("doctor", "--data-path", prefix, "--order", "computed", *FAST)
    packing = _finding(out.stdout, "packing")
    assert "PROBLEM: at sequence length 64, concatenation cuts" in packing, out.stdout + out.stderr
    assert "packing='best-fit'" in packing
    packed = run_cli("doctor", "--data-path", prefix, "--order", "computed", "--packing", "best-fit", *FAST)
    assert "[packing] ok: at sequence length 64" in packed.stdout, packed.stdout + packed.stderr


def test_packing_figures_against_a_count_of_documents_no_sample_holds_whole():
    from tokenload.doctor.packing import packing_figures

    rng = np.random.default_rng(4)
    lengths = rng.integers(0, 200, 3000)
    f = packing_figures(lengths, 64)
    # the model: walk the stream; Megatron's sample k holds its tokens [64k, 64k + 65) (the last
    # one as a label only), and a document is cut when no sample holds all of it
    position, cut, cut_short = 0, 0, 0
    for n in lengths.tolist():
        if n == 0:
            continue
        whole = any(k * 64 <= position and position + n <= k * 64 + 65 for k in range(position // 64 + 1))
        crosses = not whole
        cut += crosses
        cut_short += crosses and n <= 65
        position += n
    assert (f["concat_cut"], f["concat_cut_short"]) == (cut, cut_short)
    assert f["packed_cut"] == int((lengths > 65).sum())
    assert 0 <= f["padding_share"] < 0.01


def test_packing_figures_of_a_blend_are_the_loaders_own(tmp_path):
    """Per source, as rows hold one source, and in the blend's shares: the padding share and
    documents per row the loader's metrics count on the rows it serves (red-team finding: the
    doctor packed every prefix's documents together, 0.00% padding and 2 documents per row at
    the median where the loader served 37.5% and 1)."""
    from tokenload.datasets import MegatronDataConfig, build_datasets
    from tokenload.doctor.packing import packing_figures
    from tokenload.loader import build_dataloader

    a = write_documents(tmp_path / "a", [np.arange(1, 4)] * 60)  # 3 tokens: one per row of 5 slots
    b = write_documents(tmp_path / "b", [np.arange(1, 3)] * 60)  # 2 tokens: two per row
    f = packing_figures([[3] * 60, [2] * 60], 4, weights=[1, 1])
    assert f["padding_share"] == pytest.approx(0.375) and (f["per_row_p50"], f["per_row_p99"]) == (1, 2)
    assert packing_figures([[3] * 60, [2] * 60], 4)["padding_share"] == (60 * 2 + 30 * 1) / (90 * 4)
    cfg = MegatronDataConfig(sequence_length=4, blend=["1", a, "1", b], split="100,0,0", order="computed",
                             packing="best-fit")
    loader = build_dataloader(build_datasets(cfg, [60, 0, 0])[0], micro_batch_size=4, num_workers=0)
    for _ in loader:
        pass
    served = loader.metrics()["packing"]
    assert served["padding_share"] == pytest.approx(f["padding_share"])
    assert (served["documents_per_row"]["p50"], served["documents_per_row"]["p99"]) == (1, 2)
    out = run_cli("doctor", "--data-path", "1", a, "1", b, "--seq-length", "4", "--split", "100,0,0",
                  "--steps", "2", "--packing", "best-fit")
    assert "pads 37.50% of the slots, 1 document per row at the median (p99 2)" in _finding(out.stdout, "packing")
    # a prefix listed twice weighs the sum of its weights (3 + 1 for b against 4 for a: 50/50)
    out = run_cli("doctor", "--data-path", "3", b, "4", a, "1", b, "--seq-length", "4", "--split", "100,0,0",
                  "--steps", "2", "--packing", "best-fit")
    assert "pads 37.50% of the slots" in _finding(out.stdout, "packing")


def test_build_policy_none_without_a_prepared_cache_is_a_finding_not_a_crash(tmp_path):
    prefix = _corpus(tmp_path / "data")
    cache = tmp_path / "cache"
    cache.mkdir()
    out = run_cli("doctor", "--data-path", prefix, "--data-cache-path", cache, "--build-policy", "none",
                  "--train-samples", "200", *FAST)
    assert out.returncode == 1, out.stdout + out.stderr
    stall = _finding(out.stdout, "startup")
    assert "every rank fails at once with a CacheError" in stall and "prepare-cache" in stall
    # 'none' builds nothing: the time said is of building the caches it needs
    assert "building them takes" in stall and "build_policy='none')" not in stall


def test_a_weighted_blend_is_diagnosed_with_and_without_a_train_size(tmp_path):
    from tokenload.doctor.packing import packing_figures
    from tokenload.format import TokenFile

    prefixes = [_corpus(tmp_path / "a"), _corpus(tmp_path / "b", documents=300, seed=1)]
    blend = ["30", prefixes[0], "70", prefixes[1]]
    runs = [
        ["--split", "100,0,0", "--train-samples", "200"],
        ["--split", "90,5,5"],  # no train size: one pass over the blend's train tokens
    ]
    for flags in runs:
        out = run_cli("doctor", "--data-path", *blend, "--seq-length", "64", "--steps", "6", *flags)
        assert out.returncode in (0, 1) and out.stderr == "", out.stderr
        assert "[startup]" in out.stdout and "[packing]" in out.stdout
    train = [TokenFile(p).sequence_lengths[: round(0.9 * TokenFile(p).num_sequences)] for p in prefixes]
    f = packing_figures(train, 64, weights=[30, 70])  # the train split of 90,5,5
    packing = _finding(out.stdout, "packing")
    stated = (
        f"concatenation cuts {f['concat_cut']:,} of the train split's {f['documents']:,} documents,"
        f" {f['concat_cut_short']:,} of the {f['short']:,} that fit one row"
        f" ({f['concat_cut_short'] / f['short']:.1%})"
    )
    assert stated in packing, packing
    median = round(f["per_row_p50"])
    assert f"{median} document{'s' if median != 1 else ''} per row at the median" in packing


def test_a_blend_member_whose_test_split_holds_no_sample_is_diagnosed(tmp_path):
    """The doctor builds a weighted blend's valid and test empty, on both orders it times: a
    member whose 1% test split holds less than one sample stops no run (it stopped the computed
    order's timing with a ConfigError)."""
    tiny = write_documents(tmp_path / "tiny", [np.arange(1, 4)] * 100)  # test split: 6 tokens
    blend = ["0.4", _corpus(tmp_path / "a"), "0.6", tiny]
    for packing in ("concat", "best-fit"):
        out = run_cli("doctor", "--data-path", *blend, "--split", "90,8,2", "--seq-length", "64",
                      "--steps", "6", "--packing", packing)
        assert out.returncode in (0, 1) and "error" not in out.stderr, out.stderr  # (warned: tiny repeats)
        assert "[startup]" in out.stdout and "[packing]" in out.stdout


def test_documents_per_row_is_singular_for_one(tmp_path):
    # documents of 40-60 tokens at S = 64: one per row; of 10-20 tokens: several
    from tokenload.doctor.packing import packing_figures

    rng = np.random.default_rng(2)
    for low, high, many in ((40, 60, False), (10, 20, True)):
        documents = [rng.integers(0, 250, rng.integers(low, high)) for _ in range(300)]
        median = round(packing_figures([len(d) for d in documents], 64)["per_row_p50"])
        assert (median > 1) == many
        prefix = write_documents(tmp_path / f"d{low}", documents)
        out = run_cli("doctor", "--data-path", prefix, "--order", "computed", *FAST)
        stated = f"{median} document{'s' if many else ''} per row at the median"
        assert stated in _finding(out.stdout, "packing"), out.stdout + out.stderr


def test_io_burst_advice_for_the_computed_order_is_what_applies_to_it():
    from tokenload.doctor.checks import _check_io
    from tokenload.doctor.report import DoctorConfig, Report

    def finding(**fields):
        report = Report()
        config = DoctorConfig(seq_length=64, order="computed", **fields)
        _check_io(config, 10, 3, report)
        (found,) = report.findings
        return found

    bare = finding(data_path=["a"])
    assert bare.problem and "sequences JSON" in bare.fix and "build_policy" not in bare.fix
    # with the sequences JSON, one prefix is as few opens as the computed order makes
    least = finding(data_path=["a"], sequences_path="seq.json")
    assert not least.problem and "least" in least.measured
    blend = finding(data_path=["0.3", "a", "0.7", "b"], sequences_path="seq.json")
    assert blend.problem and "merge" in blend.fix and "build_policy" not in blend.fix
    megatron = Report()
    _check_io(DoctorConfig(data_path=["a"], seq_length=64), 10, 3, megatron)
    assert "build_policy" in megatron.findings[0].fix  # the Megatron order's deferred loading


def test_read_mode_advice_follows_the_median_of_alternating_measurements(tmp_path, monkeypatch):
    from tokenload.doctor import checks
    from tokenload.doctor.report import DoctorConfig, Report

    prefix = _corpus(tmp_path / "data")
    seen: list[tuple[str, int]] = []

    def verdict(rates):
        seen.clear()

        def rate(prefix, mode, window, seed=0):
            seen.append((mode, seed))
            return rates[mode][len([m for m, _ in seen if m == mode]) - 1]

        monkeypatch.setattr(checks, "window_read_rate", rate)
        report = Report()
        checks._check_read_modes(DoctorConfig(data_path=[prefix], seq_length=64), [prefix], report)
        return report.findings[0]

    # one mmap pass 20x slower than the others (a busy moment): no advice
    calm = verdict({"mmap": [15_000, 300_000, 310_000], "pread": [320_000, 330_000, 315_000]})
    assert not calm.problem
    assert [m for m, _ in seen] == ["mmap", "pread", "pread", "mmap", "mmap", "pread"]
    assert len({s for _, s in seen}) == 6  # every measurement at places of its own
    slow = verdict({"mmap": [100_000, 90_000, 300_000], "pread": [320_000, 330_000, 315_000]})
    assert slow.problem and "pread" in slow.fix


def test_a_compare_folder_or_plot_path_that_cannot_work_is_refused_before_measuring(tmp_path):
    """`--compare /nowhere` reported a missing copy as a finding (exit 1, advising rsync), and a
    `--plot` destination was checked only after the measuring, under a temporary name that it
    left behind (red-team findings): each is a usage error first, exit 2, nothing written."""
    prefix = _corpus(tmp_path / "data")
    folder = tmp_path / "a-folder"
    folder.mkdir()
    for flags, words in (
        (["--compare", tmp_path / "nowhere"], "is not a folder"),
        (["--plot", folder], "is a folder; expected a file name"),
        (["--plot", tmp_path / "missing" / "x.png"], "does not exist"),
    ):
        out = run_cli("doctor", "--data-path", prefix, "--order", "computed", *FAST, *flags)
        assert out.returncode == 2 and words in out.stderr, out.stderr
        assert "[" not in out.stdout, out.stdout  # no finding: nothing was measured
    assert list(folder.iterdir()) == []


def _cut_by_concatenation(lengths, seq_length):
    """Documents no sample holds whole, walking the stream: Megatron's sample k holds its tokens
    [k S, k S + S + 1)."""
    position, cut = 0, 0
    for n in lengths:
        if n == 0:
            continue
        first = position // seq_length
        cut += not any(k * seq_length <= position and position + n <= k * seq_length + seq_length + 1
                       for k in range(first + 1))
        position += n
    return cut


def test_packing_is_measured_on_the_train_split_as_the_job_trains_on_it(tmp_path):
    """The packing finding counted the whole token file, whatever the split (a user's 98,2,0
    and 50,50,0 both said "cuts 251 of 290 documents"): it counts the train split's documents,
    the first round(share x 290) by Megatron's rule, and states the padding and documents per
    row the loader serves on that train split, in either order."""
    from tokenload.datasets import MegatronDataConfig, build_datasets
    from tokenload.format import TokenFile
    from tokenload.loader import build_dataloader

    prefix = _corpus(tmp_path / "data", documents=290)
    lengths = TokenFile(prefix).sequence_lengths.tolist()
    stated = {}
    for split, train_share in (("98,2,0", 0.98), ("50,50,0", 0.5)):
        train = lengths[: round(train_share * len(lengths))]  # Megatron's split of 290 sequences
        cut = _cut_by_concatenation(train, 64)
        for order in ("megatron", "computed"):
            out = run_cli("doctor", "--data-path", prefix, "--seq-length", "64", "--split", split, "--steps", "2",
                          "--order", order, "--packing", "best-fit")
            packing = _finding(out.stdout, "packing")
            assert f"concatenation cuts {cut} of the train split's {len(train)} documents," in packing, packing
            config = MegatronDataConfig(sequence_length=64, blend=[prefix], split=split, order=order,
                                        packing="best-fit")
            loader = build_dataloader(build_datasets(config, [None, None, None])[0], micro_batch_size=4,
                                      num_workers=0)
            for _ in loader:  # one epoch of the train split's rows
                pass
            served = loader.metrics()["packing"]
            median, p99 = served["documents_per_row"]["p50"], served["documents_per_row"]["p99"]
            assert (
                f"pads {served['padding_share']:.2%} of the slots, {median} document{'s' if median != 1 else ''}"
                f" per row at the median (p99 {p99})"
            ) in packing, packing
            stated[split, order] = packing.split("; best-fit")[0]
    assert stated["98,2,0", "megatron"] != stated["50,50,0", "megatron"]
    assert stated["98,2,0", "megatron"] == stated["98,2,0", "computed"]


def test_the_prepare_cache_command_is_the_jobs_own_when_given_its_length_flags(tmp_path):
    """The doctor printed `prepare-cache ... --train-valid-test-num-samples epoch epoch epoch`,
    whose caches a job run with --train-iters does not find (the names hold the sample counts):
    given the job's length flags, it prints them, and the caches that command writes are the
    ones the job loads, Megatron's counts computed here by hand."""
    from tokenload.datasets import MegatronDataConfig, build_datasets
    from tokenload.errors import CacheError

    prefix = _corpus(tmp_path / "data")
    cache = tmp_path / "cache"
    job = ("--train-iters", "20", "--global-batch-size", "8", "--eval-interval", "10", "--eval-iters", "2")
    common = ("--data-path", prefix, "--data-cache-path", cache, "--split", "90,8,2", "--seq-length", "64",
              "--steps", "2")
    out = run_cli("doctor", *common, *job)
    stall = _finding(out.stdout, "startup")
    command = re.search(r"fix: run `(mkdir -p [^`]* && tokenload prepare-cache [^`]*)`", stall).group(1)
    assert "--train-iters 20 --global-batch-size 8 --eval-iters 2 --eval-interval 10" in command, command
    assert "--train-valid-test-num-samples" not in command and "--train-samples" not in command
    prepared = run_shell(command)
    assert prepared.returncode == 0, prepared.stderr
    # Megatron's counts: train 20 x 8, valid (20 // 10 + 1) x 2 x 8, test 2 x 8
    config = MegatronDataConfig(sequence_length=64, blend=[prefix], split="90,8,2", path_to_cache=str(cache),
                                build_policy="none")
    build_datasets(config, [160, 48, 16])  # loaded: build_policy="none" builds nothing
    with pytest.raises(CacheError):
        build_datasets(config, [None, None, None])  # the counts the doctor used to print
    after = run_cli("doctor", *common, "--build-policy", "none", *job)
    assert "[startup] ok: the index caches are prepared" in after.stdout, after.stdout + after.stderr
    # without the job's flags the doctor counts one epoch per split: not the job's caches, and
    # its command says so
    bare = run_cli("doctor", *common, "--build-policy", "none")
    stall = _finding(bare.stdout, "startup")
    assert "PROBLEM" in stall and "--train-valid-test-num-samples epoch epoch epoch" in stall, stall
    assert "a job with other counts does not find its caches" in stall
    assert "Give the doctor the job's --train-iters (or --train-samples), --global-batch-size" in stall


def test_the_jobs_length_flags_need_its_global_batch(tmp_path):
    prefix = _corpus(tmp_path / "data")
    out = run_cli("doctor", "--data-path", prefix, "--train-iters", "20", *FAST)
    assert out.returncode == 2 and "need its --global-batch-size" in out.stderr, out.stderr
    assert "[" not in out.stdout


def test_exit_status_is_0_without_problems_1_with_2_on_an_error_130_interrupted_141_on_a_closed_pipe(
        tmp_path, monkeypatch, capsys):
    """The exit statuses docs/FEATURES.md ("Troubleshoot") and `tokenload doctor --help` list."""
    import subprocess
    import sys

    import tokenload.doctor
    from tokenload.cli.main import main
    from tokenload.doctor.report import Finding, Report

    prefix = _corpus(tmp_path / "data")
    found: list[Finding] = []

    def diagnose(config):
        return Report(findings=list(found))

    monkeypatch.setattr(tokenload.doctor, "diagnose", diagnose)
    found[:] = [Finding("startup", False, "fine")]
    assert main(["doctor", "--data-path", prefix, "--seq-length", "64"]) == 0
    assert "no problem found" in capsys.readouterr().out
    found.append(Finding("prefixes", True, "many", "merge them"))
    assert main(["doctor", "--data-path", prefix, "--seq-length", "64"]) == 1
    assert "1 problem(s)" in capsys.readouterr().out

    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(tokenload.doctor, "diagnose", interrupted)
    assert main(["doctor", "--data-path", prefix, "--seq-length", "64"]) == 130
    assert "tokenload doctor: interrupted" in capsys.readouterr().err
    # the real command: a problem found (no prepared cache for build_policy='none') is 1
    none = run_cli("doctor", "--data-path", prefix, "--build-policy", "none", *FAST)
    assert none.returncode == 1 and "PROBLEM" in none.stdout, none.stdout + none.stderr
    # an error is 2, one line on stderr and no report: usage, a missing prefix, a bad value
    for flags, words in (
        (["--data-path", prefix, "--no-such-flag", *FAST], "--no-such-flag: no such flag"),
        (["--data-path", tmp_path / "missing", *FAST], "missing"),
        (["--data-path", prefix, "--seq-length", "0"], "must be greater than 0"),
        (["--data-path", prefix, *FAST, "--split", "0,0,0"], "split"),
    ):
        out = run_cli("doctor", *flags)
        assert out.returncode == 2 and words in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert "[" not in out.stdout, out.stdout
    # a reader that has gone before the report is printed (`tokenload doctor ... | head`): 141
    process = subprocess.Popen([sys.executable, "-m", "tokenload.cli.main", "doctor", "--data-path", prefix,
                                "--order", "computed", *FAST], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    _, err = process.communicate(timeout=300)
    assert process.returncode == 141 and b"Traceback" not in err, err
    usage = " ".join(run_cli("doctor", "--help").stdout.split())
    assert "exit status: 0 no problem found; 1 one or more problems found" in usage
    assert "2 an error" in usage and "130 interrupted" in usage and "141 the reader" in usage


def test_the_summary_line_says_what_each_problem_is_in_a_few_words(tmp_path, monkeypatch, capsys):
    """The last line named the problems by key only ("2 problem(s) (io-burst, packing)"): each
    comes with a few words on what it is, there and in `tokenload demo`'s line."""
    prefix = _corpus(tmp_path / "data")
    out = run_cli("doctor", "--data-path", prefix, "--data-cache-path", tmp_path / "cache", "--build-policy",
                  "rank0", *FAST)
    assert out.returncode == 1, out.stderr
    opens, stats = map(int, re.search(r"\[io-burst\] PROBLEM: (\d+) opens and (\d+) stats", out.stdout).groups())
    share = float(re.search(r"that fit one row \(([\d.]+)%\)", _finding(out.stdout, "packing")).group(1))
    last = out.stdout.strip().splitlines()[-1]
    # the steady state is a timing: on a loaded machine it may be a problem too (then named)
    slow = "PROBLEM" in _finding(out.stdout, "steady-state")
    parts = [
        "startup: no prepared cache: indices built at startup",
        f"io-burst: {opens + stats} opens/stats per rank at startup",
        *(["steady-state: the loader at "] if slow else []),
        f"packing: concatenation cuts {share:.0f}% of documents that fit a row)",
    ]
    assert last.startswith(f"{3 + slow} problem(s) found (") and all(p in last for p in parts), last
    assert last.endswith(parts[-1]), last
    # the demo's line (its doctor stubbed: the words are the findings')
    import tokenload.cli.demo as demo
    import tokenload.doctor
    from tokenload.doctor.report import Finding, Report

    report = Report(findings=[
        Finding("io-burst", True, "10 opens and 3 stats", "a sequences JSON", "13 opens/stats per rank at startup"),
        Finding("read-mode", False, "fine"),
        Finding("packing", True, "cuts", "pack", "concatenation cuts 66% of documents that fit a row"),
    ])
    monkeypatch.setattr(tokenload.doctor, "diagnose", lambda config: report)
    job = dict(prefix=prefix, seq_length=64, cache=None, split="100,0,0", sizes=[None], seed=1, sequences=None,
               global_batch=8, step_ms=20.0)
    demo._doctor(job, 2, "")
    said = capsys.readouterr().out
    assert ("2 problem(s) (io-burst: 13 opens/stats per rank at startup;"
            " packing: concatenation cuts 66% of documents that fit a row) in") in said, said


def test_caches_named_for_a_tokenizer_are_found_with_the_jobs_tokenizer_flags(tmp_path):
    """The doctor had no tokenizer flags: it looked for caches named for no tokenizer, said
    `[startup] ok` for caches a job with a tokenizer identity does not find, and printed a
    prepare-cache command whose caches that job does not load."""
    from tokenload.datasets import MegatronDataConfig, build_datasets
    from tokenload.errors import CacheError
    from tokenload.megatron_args import NULL_TOKENIZER_CLASS

    prefix = _corpus(tmp_path / "data")
    cache = tmp_path / "cache"
    job = ("--data-path", prefix, "--data-cache-path", cache, "--train-samples", "200", *FAST)
    null = ("--tokenizer-type", "NullTokenizer", "--vocab-size", "256")
    prepared = run_cli("prepare-cache", "--data-path", prefix, "--data-cache-path", cache, "--split", "100,0,0",
                       "--seq-length", "64", "--train-valid-test-num-samples", "200", "epoch", "epoch", *null)
    assert prepared.returncode == 0, prepared.stderr
    named = run_cli("doctor", *job, "--build-policy", "none", *null)
    assert "[startup] ok: the index caches are prepared" in named.stdout, named.stdout + named.stderr
    identity = {"class": NULL_TOKENIZER_CLASS, "tokenizer_path": None, "vocab_size": "256", "pad_id": "-1"}
    given = run_cli("doctor", *job, "--build-policy", "none", "--tokenizer-identity", json.dumps(identity))
    assert "[startup] ok: the index caches are prepared" in given.stdout, given.stdout + given.stderr
    bare = run_cli("doctor", *job, "--build-policy", "none")  # caches named for no tokenizer
    assert "PROBLEM" in _finding(bare.stdout, "startup"), bare.stdout + bare.stderr
    # and caches named for no tokenizer are not the job's: not `ok` (what the doctor said)
    plain = tmp_path / "plain"
    plain.mkdir()
    prepared = run_cli("prepare-cache", "--data-path", prefix, "--data-cache-path", plain, "--split", "100,0,0",
                       "--seq-length", "64", "--train-valid-test-num-samples", "200", "epoch", "epoch")
    assert prepared.returncode == 0, prepared.stderr
    unnamed = run_cli("doctor", *job[:2], "--data-cache-path", plain, *job[4:], "--build-policy", "none", *null)
    assert "PROBLEM" in _finding(unnamed.stdout, "startup"), unnamed.stdout + unnamed.stderr
    unnamed = run_cli("doctor", *job[:2], "--data-cache-path", plain, *job[4:], "--build-policy", "none")
    assert "[startup] ok: the index caches are prepared" in unnamed.stdout, unnamed.stdout + unnamed.stderr
    # the printed command writes the caches that a job naming the tokenizer loads
    other = tmp_path / "other"
    out = run_cli("doctor", "--data-path", prefix, "--data-cache-path", other, "--train-samples", "200", *FAST,
                  "--build-policy", "rank0", "--tokenizer-identity", json.dumps(identity))
    stall = _finding(out.stdout, "startup")
    command = re.search(r"fix: run `(mkdir -p [^`]* && tokenload prepare-cache [^`]*)`", stall).group(1)
    assert "--tokenizer-identity" in command, command
    done = run_shell(command)
    assert done.returncode == 0, done.stderr
    config = MegatronDataConfig(sequence_length=64, blend=[prefix], split="100,0,0", path_to_cache=str(other),
                                build_policy="none", tokenizer=identity)
    build_datasets(config, [200, None, None])  # loaded: build_policy="none" builds nothing
    with pytest.raises(CacheError):
        build_datasets(dataclasses.replace(config, tokenizer=None), [200, None, None])


def test_the_tokenizer_flags_are_checked_as_prepare_cache_checks_them(tmp_path):
    prefix = _corpus(tmp_path / "data", documents=20)
    for flags, words in ((("--tokenizer-type", "NullTokenizer"), "needs --vocab-size"),
                         (("--tokenizer-type", "GPT2BPETokenizer"), "derives only NullTokenizer's"),
                         (("--tokenizer-identity", "{"), "is not JSON")):
        out = run_cli("doctor", "--data-path", prefix, *FAST, *flags)
        assert out.returncode == 2 and words in out.stderr, out.stderr
        assert "[" not in out.stdout  # refused before measuring
