"""``tokenload info``, ``verify``, ``merge`` and ``convert``: inspect, check, join and convert token
files."""

from __future__ import annotations

import argparse
import json
import sys

from ..format import check_file, convert_token_file, describe, merge_token_files, prefixes_in
from ..format.idx import dtype_code, prefix_of
from .vocabulary import to_flags

_FORMATS = {
    "MMIDIDX": "MMIDIDX (Megatron mmap)",
    "TNTIDX": "TNTIDX (legacy fairseq cached/lazy index, read into memory at open;"
    " `tokenload convert` rewrites it as MMIDIDX)",
}
_PREFIX_HELP = "token file: PREFIX, PREFIX.bin or PREFIX.idx (the pair PREFIX.bin + PREFIX.idx)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    register_info(sub)
    register_verify(sub)
    register_merge(sub)
    register_convert(sub)


def register_info(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "info",
        help="describe token files: counts, dtype, document lengths, sidecar",
        description="Describe Megatron token files: dtype, document, sequence and token counts,"
        " document length percentiles, and the tokenload sidecar (PREFIX.json: tokenizer and"
        " hashes) when there is one. Reads only the .idx, so it is quick on any size. An index"
        " whose structure is damaged (what verify checks first) is described with a PROBLEM"
        " line per fault, and the exit status is 1.",
    )
    p.add_argument("prefixes", nargs="+", metavar="PREFIX", help=_PREFIX_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object per prefix")
    p.set_defaults(func=run_info)


def run_info(args: argparse.Namespace) -> int:
    damaged = 0
    for prefix in args.prefixes:
        d = describe(prefix)
        damaged += bool(d["problems"])
        if args.json:
            print(json.dumps(d, sort_keys=True))
            continue
        pct = d["document_tokens"]
        print(f"{d['prefix']}")
        print(f"  format       {_FORMATS[d['index_format']]}")
        print(f"  dtype        {d['dtype']} (code {d['dtype_code']})")
        if d["dtype_note"]:
            print(f"  note         {d['dtype_note']}")
        print(f"  documents    {d['documents']:,} ({d['empty_documents']:,} empty)")
        if d["documents_from_sequences"]:
            print(
                "  note         the index records no document boundaries (document_indices == [0],"
                " as GPT-NeoX's merge writes it): each sequence is read as one document"
            )
        for problem in d["problems"]:  # before the figures it makes wrong
            print(f"  PROBLEM      {problem} (run `tokenload verify {d['prefix']}`)")
        print(f"  sequences    {d['sequences']:,}")
        print(f"  tokens       {d['tokens']:,}")
        print(f"  bytes        .bin {d['bin_bytes']:,}  .idx {d['idx_bytes']:,}")
        print(
            f"  doc tokens   mean {d['mean_document_tokens']:.1f}  min {pct['p0']}"
            f"  p50 {pct['p50']}"
            f"  p90 {pct['p90']}  p99 {pct['p99']}  max {pct['p100']}"
        )
        side = d["sidecar"]
        if side is None and d["foreign_sidecar"]:
            print(
                f"  sidecar      {d['prefix']}.json is not a tokenload sidecar (not JSON, or"
                " another tool's file): ignored"
            )
        elif side is None:
            print("  sidecar      none (written by another tool)")
        else:
            tok = side.get("tokenizer") or {}
            name = tok.get("name", "unknown")
            print(
                f"  tokenizer    {name} (vocab {tok.get('vocab_size', '?')},"
                f" eod {tok.get('eod_id', '?')})"
            )
            print(
                f"  xxh3_64      .bin {side['hashes']['bin']['xxh3_64']}"
                f"  .idx {side['hashes']['idx']['xxh3_64']}"
            )
    return 1 if damaged else 0


def register_verify(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify",
        help="check token files: structure, token values, hashes",
        description="Check Megatron token files. Always: the structure (header, file sizes,"
        " sequence pointers, document indices). Every token against a vocabulary size: the one"
        " given with --vocab-size, else the sidecar's (PREFIX.json) when there is one; files"
        " without a sidecar (written by Megatron) get the structure check only unless"
        " --vocab-size is given. With --hashes, both files against the sidecar's xxh3-64 hashes."
        " Each file's line says what was checked. Exit status: 0 every file valid, 1 a file is"
        " invalid, 2 a usage error (bad flag, missing or unreadable file).",
    )
    p.add_argument("prefixes", nargs="+", metavar="PREFIX", help=_PREFIX_HELP)
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        metavar="N",
        help="check every token is below N (default: the sidecar's tokenizer vocab_size, if any)",
    )
    p.add_argument(
        "--hashes", action="store_true", help="also check the files against the sidecar's hashes"
    )
    p.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    if args.vocab_size is not None and args.vocab_size <= 0:
        from ..errors import ConfigError

        raise ConfigError(
            f"--vocab-size is {args.vocab_size}, expected a positive number of token ids",
            hint="pass the tokenizer's vocabulary size, e.g. --vocab-size 50257",
        )
    failed = 0
    for prefix in args.prefixes:
        result = check_file(prefix, vocab_size=args.vocab_size, hashes=args.hashes)
        checked = to_flags("; ".join(result.checked))  # the vocab_size given: --vocab-size
        if len(result.checked) == 1:
            checked += "; structure only: pass --vocab-size N or --hashes to check the tokens"
        if result.problems:
            failed += 1
            print(f"FAIL {prefix}  [checked: {checked}]")
            for problem in result.problems:
                print(f"  {problem}")
        else:
            print(f"OK   {prefix}  [checked: {checked}]")
    if failed:
        print(f"{failed} of {len(args.prefixes)} token files failed verification", file=sys.stderr)
        return 1
    return 0


def register_merge(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "merge",
        help="concatenate token files (Megatron merge_datasets semantics)",
        description="Concatenate token files into one, as Megatron's tools/merge_datasets.py does:"
        " inputs in the given order (or every prefix in --input DIR, sorted by name), documents"
        " kept, same dtype required. The output appears only when complete; the hidden"
        " temporaries of a killed merge are removed by the next merge into the same prefix.",
    )
    p.add_argument(
        "prefixes", nargs="*", metavar="PREFIX", help="inputs in order (or use --input DIR)"
    )
    p.add_argument(
        "--input", default=None, metavar="DIR", help="merge every prefix in DIR, sorted by name"
    )
    p.add_argument(
        "--output-prefix",
        required=True,
        help="output PREFIX (PREFIX.bin, PREFIX.idx and PREFIX.json are written)",
    )
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
        f"merged {len(prefixes)} token files into {prefix_of(args.output_prefix)}:"
        f" {sidecar.documents:,} documents,"
        f" {sidecar.tokens:,} tokens ({sidecar.dtype})"
    )
    return 0


def register_convert(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "convert",
        help="rewrite a token file as megatron-core's MMIDIDX (legacy TNTIDX, GPT-NeoX files)",
        description="Rewrite one token file as megatron-core's MMIDIDX pair: the bytes"
        " megatron-core's IndexedDatasetBuilder writes for the same documents, in the same dtype."
        " Reads the legacy fairseq cached/lazy index (TNTIDX, GPT-NeoX data_impl cached/lazy),"
        " GPT-NeoX's MMIDIDX files with its swapped float dtype codes 6/7 (written with"
        " megatron-core's codes), and"
        " GPT-NeoX's merged files without document boundaries (written with one document per"
        " sequence). The output appears only when complete.",
    )
    p.add_argument("prefix", metavar="PREFIX", help=_PREFIX_HELP)
    p.add_argument(
        "--output-prefix",
        required=True,
        help="output PREFIX (PREFIX.bin, PREFIX.idx and PREFIX.json are written)",
    )
    p.add_argument(
        "--dtype-codes",
        choices=["auto", "megatron", "neox"],
        default="auto",
        help="dtype-code table of the input; auto resolves the float codes 6/7 by the .bin size",
    )
    p.set_defaults(func=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    sidecar = convert_token_file(args.prefix, args.output_prefix, dtype_codes=args.dtype_codes)
    origin = sidecar.metadata["converted_from"]
    boundaries = "; one document per sequence (the input has no document boundaries)"
    print(
        f"converted {origin['prefix']} ({origin['index_format']},"
        f" dtype code {origin['dtype_code']})"
        f" into {prefix_of(args.output_prefix)} (MMIDIDX, dtype code {dtype_code(sidecar.dtype)}):"
        f" {sidecar.documents:,} documents, {sidecar.tokens:,} tokens ({sidecar.dtype})"
        f"{boundaries if origin['documents_from_sequences'] else ''}"
    )
    return 0
