"""``tokenload state STATE_FILE``: what a saved loader state says about the job's data: global
samples consumed, the weights schedule's position, the skips, and per source the samples drawn,
skipped and delivered, tokens and epoch (``loader.ledger``; the same whatever the topology).

The file is the JSON of ``loader.state_dict()``, or a checkpoint (JSON, or a ``torch.save`` file
read with ``weights_only=True``) that holds it somewhere in nested dicts."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
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
        print(json.dumps(state.get("accounting"), indent=2))
    else:
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


def _states(value: Any, key: str, depth: int) -> Iterator[tuple[str, dict]]:
    if not isinstance(value, dict) or depth == 0:
        return
    if "consumed_samples" in value and "fingerprint" in value:
        yield key, value
        return
    for name, item in value.items():
        yield from _states(item, f"{key}.{name}" if key else str(name), depth - 1)


def _choices(found: dict[str, Any]) -> str:
    return ("pick one with --key: " + ", ".join(repr(k) for k in found)) if found else ""


def format_state(state: dict[str, Any]) -> str:
    lines = [
        f"loader state: {state['consumed_samples']} global samples consumed (saved at dp_size"
        f" {state.get('dp_size')}, micro_batch_size {state.get('micro_batch_size')};"
        f" fingerprint {state['fingerprint']})"
    ]
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
        f"{'source':<40} {'drawn':>10} {'skipped':>8} {'samples':>10} {'tokens':>13} {'epoch':>5}"
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
