"""`draftsmith export`: write a trained drafter in an engine's format, validate it, print the
serving command.

    draftsmith export runs/eagle3-llama3.1-8b/final --to vllm   --out exported/vllm
    draftsmith export runs/eagle3-llama3.1-8b/final --to sglang --out exported/sglang
    draftsmith export runs/eagle3-llama3.1-8b/final --to trtllm --out exported/trtllm
    draftsmith export runs/draft-lm/final --to hf --out exported/draft
    draftsmith export runs/eagle3-stories260k/final --to llama.cpp --out exported/llamacpp [--target-gguf F] [--gguf-type q8_0]
"""
from __future__ import annotations

import sys

from draftsmith.export.layout import DTYPES, ExportOptions, ExportValidationError


def add_arguments(parser) -> None:
    from draftsmith.core.flags import argparse_kwargs, flag_fields, flag_name
    from draftsmith.export import EXPORTERS

    parser.add_argument("checkpoint", help="a draftsmith checkpoint directory, e.g. runs/NAME/final")
    parser.add_argument("--to", required=True, choices=EXPORTERS.names(),
                        help="engine format (llama.cpp: GGUF files, export/llamacpp/layouts.py)")
    parser.add_argument("--out", required=True, help="output directory (built elsewhere, moved in when valid)")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None, help="weights dtype (default: the checkpoint's; sglang, trtllm: the target's)")
    parser.add_argument("--num-speculative-tokens", type=int, default=None,
                        help="draft tokens per round in the serving config (default: the drafter's)")
    parser.add_argument("--verifier", default=None, help="the verifier as the engine loads it (default: recipe target.path)")
    parser.add_argument("--engine-version", default=None,
                        help="vllm: 0.9.2, 0.20.0, 0.27.0 or 0.33.0; sglang: 0.5.23 (default: the newest): the release "
                             "the export and its serve command are checked against (export/engine_versions.py)")
    parser.add_argument("--no-validate", action="store_true", help="skip the validation gate (not recommended)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a previous draftsmith export in --out (only the files an export writes)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="run the target's custom modelling code (never enabled by a checkpoint's config.yaml)")
    added = set()
    for fmt in EXPORTERS.names():  # each format's own flags, declared by its Exporter (Exporter.Flags)
        flags = EXPORTERS.get(fmt).Flags
        fields = [f for f in flag_fields(flags) if f.name not in added] if flags is not None else []
        group = parser.add_argument_group(f"--to {fmt} only") if fields else None
        for field in fields:  # a flag two formats declare is added once (the first format's help)
            kwargs = argparse_kwargs(flags, field)
            if kwargs.get("action") is None and "choices" not in kwargs:
                kwargs.setdefault("metavar", field.name.upper())
            group.add_argument(flag_name(field), dest=field.name, **kwargs)
            added.add(field.name)


def format_flags_given(args) -> dict:
    """{field: value} of every format's own flags set on the command line (export() refuses those --to does not take)."""
    from draftsmith.export.options import format_flags

    return {f.name: getattr(args, f.name) for f in format_flags()
            if getattr(args, f.name, f.field.default) != f.field.default}


def main(args) -> int:
    from draftsmith.export import EXPORTERS
    from draftsmith.export.api import export

    opts = ExportOptions(dtype=args.dtype, num_speculative_tokens=args.num_speculative_tokens, verifier=args.verifier,
                         engine_version=args.engine_version, flags=format_flags_given(args))
    try:
        result = export(args.checkpoint, args.to, args.out, opts, validate=not args.no_validate,
                        overwrite=args.overwrite, trust_remote_code=args.trust_remote_code)
    except (ExportValidationError, FileExistsError, FileNotFoundError, ValueError, OSError) as exc:
        several = isinstance(exc, ExportValidationError) and len(exc.problems) > 1  # one problem a line
        print(f"draftsmith export: {exc if several else ' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    for line in EXPORTERS.get(args.to)().summary(args.checkpoint, result):
        print(line)
    print("serve it with:")
    print(f"  {result.serve_command}")
    return 0
