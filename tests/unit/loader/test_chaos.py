"""A short chaos run (issue 24): each fault of ``benchmarks/chaos.py`` at least once, under fork
and spawn, over the Megatron order, the computed order and a flat file, read by mmap and pread;
every batch equal to the fault-free run's, no case past its bound, and a WorkerError with every
field where the faults spend the restart budget. The full run (300+ faults) is the benchmark."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import chaos  # spawned workers find it through sys.path

CASES = [  # method, workers, kind, read mode, faults (fault, micro-batch), budget, expected
    ("fork", 2, "flat", "mmap", [("kill", 3)], 3, "ok"),
    ("fork", 4, "megatron", "pread", [("stop", 2), ("raise", 6)], 3, "ok"),
    ("fork", 1, "computed", "mmap", [("stop_cont", 4)], 3, "ok"),
    ("fork", 2, "flat", "pread", [("exit_start", 0), ("block", 5)], 3, "ok"),
    ("fork", 2, "computed", "pread", [("exit_start", 4)], 3, "ok"),
    ("spawn", 2, "megatron", "mmap", [("exit_start", 0), ("kill", 6)], 3, "ok"),
    ("fork", 2, "megatron", "mmap", [("raise", 2), ("kill", 7)], 0, "worker_error"),
    ("fork", 1, "flat", "mmap", [("stop", 3), ("kill", 9)], 1, "worker_error"),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    import torch  # noqa: F401  (the loader imports it; not inside the first case's bound)

    files = chaos.make_data(tmp_path_factory.mktemp("chaos"))
    built = {}
    for _, _, kind, mode, *_ in CASES:
        if (kind, mode) not in built:
            dataset = chaos.build(kind, mode, files)
            built[kind, mode] = (dataset, chaos.expected_batches(dataset))
    return built


@pytest.mark.timeout(120)
def test_short_chaos_run(data):
    outcomes = []
    for i, (method, workers, kind, mode, faults, budget, expected) in enumerate(CASES):
        case = chaos.Case(method=method, workers=workers, kind=kind, read_mode=mode,
                          faults=faults, budget=budget, seed=i)
        dataset, want = data[kind, mode]
        outcome = chaos.run_case(case, dataset, want)
        outcomes.append(outcome)
        if outcome.result != expected:  # the whole detail: a stalled worker's stack, say
            pytest.fail(f"{case}: {outcome.result}, expected {expected}\n{outcome.detail}")
        assert outcome.seconds < case.bound
    summary = chaos.summarize(outcomes)
    assert not summary["failures"]
    assert set(summary["by_fault"]) == set(chaos.FAULTS)
    assert summary["restarts"] >= 8 and summary["stalls"] >= 2
    assert summary["recover_s"]["n"] >= 5
