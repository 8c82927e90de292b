"""Plant one known bug in tokenload for a test run, without editing a file (tests/PLANTED.md).

As a pytest plugin: ``PLANT=<name> PYTHONPATH=tests python -m pytest -p plant <tests>`` replaces
the function that ``PLANTS[name]`` names by a copy of its source with one change (``old`` ->
``new``, which must occur exactly once), in the test process before any test runs: the consumer
side of the loader, the datasets and the adapters all run there (and in forked workers, which
inherit it; a spawned worker imports the sound code). A plant whose text is no longer found fails
the run at once, so a moved line is noticed, not silently "caught".

As a script: ``python tests/plant.py [NAME ...]`` runs each plant's tests with the plant (they
must fail) and reports caught or SURVIVED per plant; ``--sound`` runs them without plants (they
must pass). Exit status 1 when a plant survived or a sound run failed.
"""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Plant:
    module: str
    function: str  # "name" or "Class.name"
    old: str
    new: str
    tests: tuple[str, ...]  # pytest node ids or files that must fail with the plant
    what: str


W = "tests/unit/test_guarantees_workers.py"
M = "tests/unit/test_guarantees_mixture.py"
C = "tests/unit/test_guarantees_caches.py"
A = "tests/unit/test_guarantees_adapters.py"

PLANTS: dict[str, Plant] = {
    # -- the ten points -------------------------------------------------------------------
    "spin-counts-as-progress": Plant(
        "tokenload.loader.workers",
        "WorkerPool._recv",
        "if not now.started and cpu_time(",
        "if cpu_time(",
        (f"{W}::test_a_worker_spinning_inside_a_read_is_replaced",),
        "a worker using the CPU counts as progressing even after it started: a busy loop in a"
        " read is never replaced",
    ),
    "stall-clock-from-last-message": Plant(
        "tokenload.loader.workers",
        "WorkerPool._recv",
        "quiet = clock - max(began, results.heard, now.heard)",
        "quiet = clock - max(results.heard, now.heard)",
        (f"{W}::test_a_slow_read_after_a_long_training_step_is_not_killed",),
        "the stall clock runs from the worker's last message, not from when the loop began to"
        " wait for its batch",
    ),
    "ledger-no-recount-on-rollback": Plant(
        "tokenload.loader.ledger",
        "Ledger._blend_counts",
        "if consumed < self._counted:",
        "if False:",
        (f"{M}::test_accounting_follows_consumed_back",),
        "per-source draws of a Megatron blend are not counted again when consumed goes back",
    ),
    "phase-cache-includes-next-start": Plant(
        "tokenload.index.schedule",
        "ScheduledMixture.draw",
        "current[1] <= lo and hi < current[2]",
        "current[1] <= lo and hi <= current[2]",
        (f"{M}::test_a_batch_ending_on_a_phase_s_first_sample_draws_it_from_the_new_phase",),
        "computed order: a micro-batch whose last sample is a phase's first is drawn wholly in"
        " the phase before",
    ),
    "segment-cache-includes-next-start": Plant(
        "tokenload.datasets.megatron.continuable",
        "ContinuableBlendedDataset._locate",
        "s.start <= lo and hi < s.end",
        "s.start <= lo and hi <= s.end",
        (f"{M}::test_a_batch_ending_on_a_phase_s_first_sample_draws_it_from_the_new_phase",),
        "Megatron order: a micro-batch whose last sample is a segment's first is located wholly"
        " in the segment before",
    ),
    "shuffle-bound-loosened": Plant(
        "tokenload.datasets.megatron.cache_match",
        "_shuffle_reasons",
        "int(shuffle.max()) >= samples",
        "int(shuffle.max()) > samples",
        (f"{C}::test_a_shuffle_entry_at_or_past_the_sample_count_is_refused_then_rebuilt",),
        "a Megatron-written cache's shuffle entry equal to the sample count passes the check",
    ),
    "blend-arrays-not-verified": Plant(
        "tokenload.caches.files",
        "map_array",
        "if key not in _VERIFIED:",
        "if key not in _VERIFIED and 'Blended' not in shown:",
        (f"{C}::test_a_blend_array_damaged_in_range_is_a_cache_error_under_build_policy_none",),
        "a blend's arrays mapped through the build manifest skip their digest",
    ),
    "chunk-last-sequence-skipped": Plant(
        "tokenload.format.reader",
        "_bad_steps",
        "return np.flatnonzero(np.diff(bounds) != sizes)",
        "return np.flatnonzero(np.diff(bounds)[:-1] != sizes[:-1])",
        (f"{C}::test_damage_at_each_chunk_boundary_is_found_by_the_batch_read",),
        "each chunk's last sequence is not checked against the next pointer",
    ),
    "megatron-restarts-carry-stalls": Plant(
        "tokenload.integrations.megatron",
        "metric_scalars",
        'out["worker-restarts"] = workers.get("restarts")',
        'out["worker-restarts"] = workers.get("stalls")',
        (
            f"{A}::test_megatron_scalars_each_carry_their_own_metric",
            f"{A}::test_megatron_restarts_scalar_counts_a_killed_worker",
        ),
        "Megatron-LM's tokenload/worker-restarts scalar carries the stall count",
    ),
    "lightning-drops-fit-offset": Plant(
        "tokenload.integrations.lightning",
        "TokenloadDataModule._start_samples",
        "start = self.consumed_samples + trainer.global_step * gbs",
        "start = trainer.global_step * gbs",
        (f"{A}::test_lightning_resume_without_loader_state_keeps_the_fit_s_offset",),
        "Lightning resume from a checkpoint without loader state forgets consumed_samples",
    ),
    "titan-seed-dropped": Plant(
        "tokenload.integrations.torchtitan",
        "_build_dataset",
        "random_seed=config.seed,",
        "",
        (f"{A}::test_torchtitan_settings_reach_the_dataset",),
        "torchtitan's --dataloader.seed is parsed, then the dataset is built with the default",
    ),
    # -- more guarantees of docs/ (self-healing, mixture control, integrity, the adapters) ------
    "replacement-skips-owed-batch": Plant(
        "tokenload.loader.workers",
        "WorkerPool._replace",
        "Start(self._generation, self._sampler, k, self.prefetch, [])",
        "Start(self._generation, self._sampler, k + len(self.processes), self.prefetch, [])",
        (
            "tests/unit/loader/test_self_heal.py"
            "::test_a_killed_worker_is_replaced_and_the_loop_gets_the_same_batches",
            f"{W}::test_a_worker_spinning_inside_a_read_is_replaced",
        ),
        "a replacement starts at the lost worker's next micro-batch after the one it owed",
    ),
    "restart-budget-off-by-one": Plant(
        "tokenload.loader.health",
        "WorkerHealth.fault",
        "if self.restarts >= self.budget:",
        "if self.restarts > self.budget:",
        (
            "tests/unit/loader/test_self_heal.py::test_a_stall_beyond_the_budget_is_a_worker_error",
            "tests/unit/loader/test_workers.py"
            "::test_a_killed_worker_beyond_the_restart_budget_is_reported",
        ),
        "one replacement more than max_worker_restarts",
    ),
    "spawn-start-counted-as-stall": Plant(
        "tokenload.loader.workers",
        "WorkerPool._recv",
        "if not now.started and cpu_time(",
        "if False and cpu_time(",
        (f"{W}::test_a_spawned_worker_that_starts_longer_than_worker_timeout_is_not_killed",),
        "a spawned worker still unpickling its dataset (busy) counts as stalled",
    ),
    "none-ignores-index-digest": Plant(
        "tokenload.datasets.sources",
        "stale_facts",
        '"index_xxh3_64": index_digest(source, cached=False),',
        "",
        (f"{C}::test_a_same_size_rewrite_of_a_token_file_is_noticed_under_build_policy_none",),
        "under build_policy='none' a token file is compared with the manifest by size only",
    ),
    "single-read-pointer-check-dropped": Plant(
        "tokenload.format.reader",
        "TokenFile.get",
        "if following - pointer != seq_len * state.itemsize:",
        "if False:",
        (
            "tests/unit/format/test_index_damage.py"
            "::test_in_range_index_damage_is_a_format_error_on_every_read_path",
        ),
        "the single-sequence read path (the other path) skips the pointer check",
    ),
    "ledger-chunk-drops-last": Plant(
        "tokenload.loader.ledger",
        "Ledger._blend_counts",
        "index[at : min(at + _CHUNK, consumed)]",
        "index[at : min(at + _CHUNK - 1, consumed)]",
        (f"{M}::test_accounting_follows_consumed_back",),
        "a Megatron blend's draws counted in chunks miss each full chunk's last sample (visible"
        " only after a jump of more than a chunk: a resume, a rollback)",
    ),
    "interleave-last-chunk-unbuilt": Plant(
        "tokenload.index.interleave",
        "Interleave._build",
        "range(first // _CHUNK, last // _CHUNK + 1)",
        "range(first // _CHUNK, last // _CHUNK)",
        (
            "tests/unit/index/test_interleave_fast.py"
            "::test_tables_built_by_chunks_are_the_reference_sample_for_sample",
        ),
        "the computed blend's schedule tables: the chunk of a read's last slot is not built",
    ),
    "lightning-finished-pass-saves-its-length": Plant(
        "tokenload.integrations.lightning",
        "_TrainLoader.state_dict",
        "_PASS_KEY: 0 if self._finished else self._in_pass",
        "_PASS_KEY: self._in_pass",
        ("tests/integrations/test_lightning.py::test_resume_continues_exactly",),
        "Lightning: a checkpoint at the end of an epoch records the finished pass's length",
    ),
    "skip-not-recorded-per-source": Plant(
        "tokenload.loader.ledger",
        "Ledger.skip",
        "taken = {k: after[k] - before[k] for k in self.keys if after[k] != before[k]}",
        "taken = {}",
        (
            "tests/unit/loader/test_mixture_skip.py"
            "::test_the_jobs_figures_equal_a_count_of_the_delivered_samples_anywhere",
        ),
        "a skip's samples are not recorded per source: delivered counts include them",
    ),
    "schedule-position-before-start": Plant(
        "tokenload.index.schedule",
        "ScheduledMixture.phase_of",
        "bisect_right(self.schedule, sample, key=",
        "bisect_right(self.schedule, sample - 1, key=",
        (f"{M}::test_the_schedule_position_changes_exactly_at_a_phase_s_start",),
        "computed order: at consumed == a phase's start the schedule position is the old entry",
    ),
    "megatron-schedule-position-before-start": Plant(
        "tokenload.datasets.megatron.continuable",
        "ContinuableBlendedDataset.schedule_position",
        'np.searchsorted(starts, consumed, side="right")',
        'np.searchsorted(starts, consumed, side="left")',
        (f"{M}::test_the_schedule_position_changes_exactly_at_a_phase_s_start",),
        "Megatron order: at consumed == a phase's start the schedule position is the old entry",
    ),
    "megatron-valid-starts-at-train-offset": Plant(
        "tokenload.integrations.megatron",
        "loaders_from_args",
        "starts = (args.consumed_train_samples, valid_start, 0)",
        "starts = (args.consumed_train_samples, args.consumed_train_samples, 0)",
        (
            "tests/integrations/test_megatron_adapter.py"
            "::test_valid_starts_at_consumed_valid_samples",
        ),
        "Megatron-LM adapter: the valid loader starts at the train loader's offset",
    ),
    "lightning-stalls-carry-restarts": Plant(
        "tokenload.integrations.scalars",
        "loader_scalars",
        'figures["worker_stalls"] = workers.get("stalls")',
        'figures["worker_stalls"] = workers.get("restarts")',
        (f"{A}::test_lightning_scalars_each_carry_their_own_metric",),
        "Lightning (the other adapter): tokenload/worker_stalls carries the restart count",
    ),
    "titan-kind-dropped": Plant(
        "tokenload.integrations.torchtitan",
        "TokenloadTitanDataLoader.__init__",
        "kind=config.kind,",
        'kind="single",',
        (f"{A}::test_torchtitan_settings_reach_the_dataset",),
        "torchtitan's --dataloader.kind is parsed, then the loader is built with the default",
    ),
}


def apply(name: str) -> None:
    """Replace ``PLANTS[name]``'s function by its planted copy (in this process)."""
    plant = PLANTS[name]
    module = importlib.import_module(plant.module)
    owner: object = module
    *path, attr = plant.function.split(".")
    for part in path:
        owner = getattr(owner, part)
    importlib.import_module("tokenload.datasets")  # its importers, so that they are rebound
    sound = inspect.unwrap(owner.__dict__[attr] if path else getattr(owner, attr))
    lines, first = inspect.getsourcelines(sound)
    source = textwrap.dedent("".join(lines))
    if source.count(plant.old) != 1:
        raise RuntimeError(f"plant {name}: {plant.old!r} is not in {plant.function} exactly once")
    flags = annotations.compiler_flag  # the __future__ feature the import bound
    code = compile(
        "\n" * (first - 1) + source.replace(plant.old, plant.new),  # tracebacks: the file's lines
        inspect.getfile(sound),
        "exec",
        flags,
        dont_inherit=True,
    )
    scope: dict[str, object] = {}
    exec(code, module.__dict__, scope)
    setattr(owner, attr, scope[attr])
    if not path:  # modules that imported the function by name hold it too
        for other in list(sys.modules.values()):
            if getattr(other, "__name__", "").startswith("tokenload") and (
                getattr(other, attr, None) is sound
            ):
                setattr(other, attr, scope[attr])


def pytest_configure(config) -> None:
    name = os.environ.get("PLANT")
    if name:
        apply(name)


def _run(tests: tuple[str, ...], plant: str | None) -> int:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    )
    env.pop("PLANT", None)
    if plant:
        env["PLANT"] = plant
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "plant",
        "-p",
        "no:cacheprovider",
        *tests,
    ]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True).returncode


def main(argv: list[str]) -> int:
    sound = "--sound" in argv
    names = [a for a in argv if not a.startswith("--")] or list(PLANTS)
    bad = 0
    for name in names:
        plant = PLANTS[name]
        code = _run(plant.tests, None if sound else name)
        if sound:
            ok = code == 0
            print(f"{'pass' if ok else 'FAIL'}  {name}  (sound code)")
        else:
            ok = code == 1  # 1: tests failed (2+: the run itself broke, e.g. a stale plant)
            print(f"{'caught' if ok else f'SURVIVED (exit {code})'}  {name}: {plant.what}")
        bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
