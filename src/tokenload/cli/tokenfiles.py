"""``tokenload info``, ``verify`` and ``merge``: inspect, check and join token files."""

from __future__ import annotations

import argparse
import json
import sys

from ..format import describe, merge_token_files, prefixes_in, verify


def register(sub) -> None:
    register_info(sub)
    register_verify(sub)
    register_merge(sub)


def register_info(sub) -> None:
    p = sub.add_parser("info", help="describe token files: counts, dtype, document lengths, sidecar")
    p.add_argument("prefixes", nargs="+", metavar="PREFIX", help="token file prefix (PREFIX.bin + PREFIX.idx)")
    p.add_argument("--json", action="store_true", help="print one JSON object per prefix")
    p.set_defaults(func=run_info)


def run_info(args: argparse.Namespace) -> int:
    for prefix in args.prefixes:
        d = describe(prefix)
        if args.json:
            print(json.dumps(d, sort_keys=True))
            continue
        pct = d["document_tokens"]
        print(f"{d['prefix']}")
        print(f"  dtype        {d['dtype']}")
        print(f"  documents    {d['documents']:,} ({d['empty_documents']:,} empty)")
        print(f"  sequences    {d['sequences']:,}")
        print(f"  tokens       {d['tokens']:,}")
        print(f"  bytes        .bin {d['bin_bytes']:,}  .idx {d['idx_bytes']:,}")
        print(
            f"  doc tokens   mean {d['mean_document_tokens']:.1f}  min {pct['p0']}  p50 {pct['p50']}"
            f"  p90 {pct['p90']}  p99 {pct['p99']}  max {pct['p100']}"
        )
        side = d["sidecar"]
        if side is None:
            print("  sidecar      none (written by another tool)")
        else:
            tok = side.get("tokenizer") or {}
            name = tok.get("name", "unknown")
            print(f"  tokenizer    {name} (vocab {tok.get('vocab_size', '?')}, eod {tok.get('eod_id', '?')})")
            print(f"  xxh3_64      .bin {side['hashes']['bin']['xxh3_64']}  .idx {side['hashes']['idx']['xxh3_64']}")
    return 0


def register_verify(sub) -> None:
    p = sub.add_parser("verify", help="check every structural invariant of token files")
    p.add_argument("prefixes", nargs="+", metavar="PREFIX")
    p.add_argument("--vocab-size", type=int, default=None, help="also check every token is below N")
    p.add_argument("--hashes", action="store_true", help="also check the files against the sidecar's hashes")
    p.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    failed = 0
    for prefix in args.prefixes:
        problems = verify(prefix, vocab_size=args.vocab_size, hashes=args.hashes)
        if problems:
            failed += 1
            print(f"FAIL {prefix}")
            for problem in problems:
                print(f"  {problem}")
        else:
            print(f"OK   {prefix}")
    if failed:
        print(f"{failed} of {len(args.prefixes)} token files failed verification", file=sys.stderr)
        return 1
    return 0


def register_merge(sub) -> None:
    p = sub.add_parser("merge", help="concatenate token files (Megatron merge_datasets semantics)")
    p.add_argument("prefixes", nargs="*", metavar="PREFIX", help="inputs in order (or use --input DIR)")
    p.add_argument("--input", default=None, metavar="DIR", help="merge every prefix in DIR, sorted by name")
    p.add_argument("--output-prefix", required=True, help="output PREFIX (.bin/.idx/.json are written)")
    p.set_defaults(func=run_merge)


def run_merge(args: argparse.Namespace) -> int:
    from ..errors import ConfigError

    if bool(args.input) == bool(args.prefixes):
        raise ConfigError(
            "give either --input DIR or a list of prefixes, not both and not neither",
            hint="tokenload merge --input shards/ --output-prefix merged",
        )
    prefixes = prefixes_in(args.input) if args.input else list(args.prefixes)
    sidecar = merge_token_files(prefixes, args.output_prefix)
    print(
        f"merged {len(prefixes)} token files into {args.output_prefix}: {sidecar.documents:,} documents,"
        f" {sidecar.tokens:,} tokens ({sidecar.dtype})"
    )
    return 0
