"""``tokenload state STATE_FILE``: what a saved loader state says about the job's data: global
samples consumed, the weights schedule's position, the skips, and per source the samples drawn,
skipped and delivered, token slots (samples x sequence length, a packed row's padding
included) and epoch (``loader.ledger``; the same whatever the topology).

The file is the JSON of ``loader.state_dict()``, or a checkpoint (JSON, or a ``torch.save`` file
read with ``weights_only=True``) that holds it somewhere in nested dicts."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError, StateError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "state",
        help="print the per-source accounting, skips and schedule position of a saved loader state",
    )
    p.add_argument(
        "state_file",
        metavar="STATE_FILE",
        help="JSON of loader.state_dict(), or a checkpoint that holds it",
    )
    p.add_argument(
        "--key",
        default=None,
        metavar="KEY",
        help="the state's key in a checkpoint holding several loader states, e.g."
        " train_loader (dots for nested keys)",
    )
    p.add_argument("--json", action="store_true", help="print the accounting as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    state = find_state(read(args.state_file), args.state_file, args.key)
    if args.json:
        print(json.dumps(state.get("accounting"), indent=2, default=repr))
    else:
        check_state(state, args.state_file)
        print(format_state(state))
    return 0


def read(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError(
            f"cannot read {path}: {exc.strerror}", hint="pass the saved state's path"
        ) from None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        pass
    try:
        import io

        import torch

        return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # not JSON, not a torch checkpoint (or no torch)
        raise ConfigError(
            f"{path} is neither JSON nor a torch checkpoint ({type(exc).__name__})",
            hint="save the loader state with json.dump(loader.state_dict(), f) or torch.save",
        ) from None


def find_state(value: Any, path: str, key: str | None = None) -> dict[str, Any]:
    """The loader state (a dict holding ``consumed_samples`` and ``fingerprint``) in ``value``: the
    one at ``key`` (dot-separated), else the only one in nested dicts; several are an error that
    lists their keys, so the accounting of one loader is never shown as another's."""
    found = {k: v for k, v in _states(value, "", 6)}
    if key is not None:
        if key not in found:
            raise ConfigError(
                f"{path} holds no loader state at key {key!r}",
                hint=_choices(found) or "pass the file where loader.state_dict() was saved",
            )
        return found[key]
    if len(found) == 1:
        return next(iter(found.values()))
    if found:
        raise ConfigError(f"{path} holds {len(found)} loader states", hint=_choices(found))
    raise ConfigError(
        f"{path} holds no loader state (a dict with consumed_samples and fingerprint)",
        hint="pass the file where loader.state_dict() was saved",
    )


def _states(value: Any, key: str, depth: int) -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(value, dict) or depth == 0:
        return
    if "consumed_samples" in value and "fingerprint" in value:
        yield key, value
        return
    for name, item in value.items():
        yield from _states(item, f"{key}.{name}" if key else str(name), depth - 1)


def _choices(found: dict[str, Any]) -> str:
    return ("pick one with --key: " + ", ".join(repr(k) for k in found)) if found else ""


# -- the fields format_state reads, checked first: a damaged file is one StateError, never a
# traceback (a file that still parses, with a renamed key, a missing field or a wrong type) ------


class _Fields:
    """Checks of one state's fields; each failure a StateError naming the field by its path in
    the state (``accounting.sources[2].drawn``) with what was found and what was expected."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, name: str, found: Any, expected: str) -> StateError:
        shown = "missing" if found is _MISSING else f"{_short(found)} ({type(found).__name__})"
        return StateError(
            f"the loader state's field {name} is {shown}, expected {expected}",
            path=self.path,
            hint="the state file is damaged or was edited: use the file loader.state_dict() was"
            " saved to (json.dump or torch.save), or the checkpoint that holds it",
        )

    def integer(
        self,
        record: dict[str, Any],
        key: str,
        where: str,
        *,
        optional: bool = False,
        least: int = 0,
    ) -> None:
        """``record[key]`` (``where.key`` in the state) is an integer >= ``least``; ``optional``:
        or null, or absent."""
        name = f"{where}.{key}" if where else key
        value = record.get(key, None if optional else _MISSING)
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            expected = f"an integer >= {least}" + (" or null" if optional else "")
            raise self.fail(name, value, expected)

    def record(self, value: Any, name: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(name, value, "an object")
        return value

    def records(self, value: Any, name: str) -> list[dict[str, Any]]:
        if not isinstance(value, list):
            raise self.fail(name, value, "a list of objects")
        return [self.record(item, f"{name}[{i}]") for i, item in enumerate(value)]


_MISSING = object()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_state(state: dict[str, Any], path: str) -> None:
    """Every field ``format_state`` reads has the type ``loader.state_dict()`` writes (None and
    absent where the loader itself may leave them out), and what the loader checks of a state
    whatever its data (its version, skips and topology history) holds; else a StateError naming
    the field: a state the loader refuses is never shown as sound."""
    from ..loader.ledger import parse_skips
    from ..loader.state import topology_history

    f = _Fields(path)
    f.integer(state, "consumed_samples", "")
    for key in ("dp_size", "micro_batch_size"):
        f.integer(state, key, "", optional=True, least=1)
    if not isinstance(state["fingerprint"], str):
        raise f.fail("fingerprint", state["fingerprint"], "a string")
    try:
        topology_history(state)  # the version and the fields every state has, then the history
        parse_skips(state.get("skips"))
    except StateError as exc:
        raise StateError(exc.message, path=path, hint=exc.hint) from None
    mixture = state.get("mixture")
    consumed = state["consumed_samples"]
    if isinstance(mixture, dict) and mixture.get("consumed") != consumed:
        raise StateError(  # as the loader refuses it
            f"the state's mixture was saved after {mixture.get('consumed')!r} samples, its"
            f" consumed_samples is {consumed!r}",
            path=path,
            hint="pass the dict saved from loader.state_dict(), unchanged",
        )
    if state.get("accounting") is None:
        return  # saved by a tokenload without accounting
    job = f.record(state["accounting"], "accounting")
    if job.get("skipped_samples") is not None:
        f.integer(job, "skipped_samples", "accounting")
    for i, skip in enumerate(f.records(job.get("skips") or [], "accounting.skips")):
        for key in ("at", "samples"):
            f.integer(skip, key, f"accounting.skips[{i}]")
    sources = job.get("sources", _MISSING)
    if sources is _MISSING:
        raise f.fail("accounting.sources", sources, "a list of objects")
    for i, source in enumerate(f.records(sources, "accounting.sources")):
        where = f"accounting.sources[{i}]"
        if not isinstance(source.get("name"), str) and not isinstance(source.get("source"), str):
            raise f.fail(f"{where}.name", source.get("name", _MISSING), "a string")
        for key in ("drawn", "skipped", "samples", "epoch"):
            f.integer(source, key, where)
        f.integer(source, "tokens", where, optional=True)
        if not isinstance(source.get("active", True), bool):
            raise f.fail(f"{where}.active", source["active"], "true or false")
    if job.get("schedule") is not None:
        _check_schedule(f, f.record(job["schedule"], "accounting.schedule"))


def _check_schedule(f: _Fields, position: dict[str, Any]) -> None:
    for key, least in (("entry", 0), ("entries", 1), ("start", 0)):
        f.integer(position, key, "accounting.schedule", least=least)
    f.integer(position, "next_change", "accounting.schedule", optional=True)
    weights = position.get("weights", _MISSING)
    if not isinstance(weights, list) or not all(
        isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights
    ):
        raise f.fail("accounting.schedule.weights", weights, "a list of numbers")


def format_state(state: dict[str, Any]) -> str:
    lines = [
        f"loader state: {state['consumed_samples']} global samples consumed (saved at dp_size"
        f" {state.get('dp_size')}, micro_batch_size {state.get('micro_batch_size')};"
        f" fingerprint {state['fingerprint']})"
    ]
    read = state.get("reads")
    if isinstance(read, dict) and read:  # what the saved run read (explain/where need the same)
        lines.append("read: " + ", ".join(f"{k}={v!r}" for k, v in read.items()))
    job = state.get("accounting")
    if not isinstance(job, dict):
        lines.append("no per-source accounting in this state (saved by an older tokenload)")
        return "\n".join(lines)
    lines.append(_schedule_line(job.get("schedule")))
    skips = job.get("skips") or []
    spans = ", ".join(f"[{s['at']}, {s['at'] + s['samples']})" for s in skips)
    spans = f" ({spans})" if spans else ""
    lines.append(f"skipped: {job.get('skipped_samples', 0)} samples{spans}")
    lines.append(
        f"{'source':<40} {'drawn':>10} {'skipped':>8} {'samples':>10} {'slots':>13} {'epoch':>5}"
    )
    for s in job.get("sources") or []:
        name = str(s.get("name") or s.get("source"))
        name = name if len(name) <= 40 else "..." + name[-37:]
        note = "" if s.get("active", True) else "  (removed; continues if it comes back)"
        tokens = "-" if s.get("tokens") is None else s["tokens"]
        lines.append(
            f"{name:<40} {s['drawn']:>10} {s['skipped']:>8} {s['samples']:>10}"
            f" {tokens:>13} {s['epoch']:>5}{note}"
        )
    lines.append(
        "slots: token positions delivered (samples x sequence length; the state's 'tokens'),"
        " a packed row's padding included; loader.metrics()['packing'] counts the padding apart"
    )
    return "\n".join(lines)


def _schedule_line(position: Any) -> str:
    if not isinstance(position, dict):
        return "schedule: none (fixed weights)"
    weights = " ".join(f"{w:g}" for w in position["weights"])
    following = position.get("next_change")
    later = "no later change" if following is None else f"next change at sample {following}"
    return (
        f"schedule: entry {position['entry'] + 1} of {position['entries']} (from sample"
        f" {position['start']}, weights {weights}); {later}"
    )
