"""`draftsmith doctor`: check a serve command or engine config against what an export was trained for.

    draftsmith doctor exported/vllm -- vllm serve meta-llama/Llama-3.1-8B-Instruct \
        --speculative-config '{"model": "exported/vllm", "num_speculative_tokens": 3, "method": "eagle3"}'
    draftsmith doctor exported/sglang -- python -m sglang.launch_server --model-path M --speculative-algorithm EAGLE3 ...
    draftsmith doctor exported/llamacpp -- llama-server -m T.gguf -md D.gguf --spec-type draft-dspark ...
    draftsmith doctor exported/trtllm --config extra_llm_api_options.yaml
    draftsmith doctor exported/vllm --config speculative_config.json [--engine-version 0.27]

Prints one line per mismatch (what the engine will do, what the drafter was trained for, the corrected flag),
notes that do not change acceptance, and the flags it does not check. Exit 1 on a mismatch that changes
acceptance or output, 0 when clean, 2 on input it cannot read (export/doctor/run.py).
"""
from __future__ import annotations

import argparse

from draftsmith.core.errors import UserError


def add_arguments(parser) -> None:
    parser.add_argument("export_dir", help="the --out directory of `draftsmith export`")
    parser.add_argument("--config", default=None,
                        help="an engine config instead of a command: vLLM speculative_config JSON, SGLang server-args "
                             "YAML, TensorRT-LLM extra_llm_api_options YAML")
    parser.add_argument("--engine-version", default=None,
                        help="the engine release the command runs on (default: the one installed here, if any)")
    parser.add_argument("serve", nargs=argparse.REMAINDER, help="-- the engine's serve command, as you run it")


OWN_OPTIONS = ("--config", "--engine-version")


def own_options_first(args) -> list[str]:
    """The serve command's words; doctor's own options written after EXPORT_DIR (argparse's remainder swallows
    them) are taken into `args` first, up to `--` or the engine's program."""
    serve = list(args.serve)
    while serve and serve[0].split("=", 1)[0] in OWN_OPTIONS:
        flag, has_eq, value = serve.pop(0).partition("=")
        if not has_eq:
            if not serve:
                raise UserError(f"doctor: {flag} needs a value")
            value = serve.pop(0)
        setattr(args, flag[2:].replace("-", "_"), value)
    return serve[1:] if serve[:1] == ["--"] else serve


def main(args) -> int:
    from draftsmith.export.doctor.run import safe_line

    try:
        report = run_doctor(args)
    except UserError as exc:  # its message may quote a received serve command: one terminal-safe line
        raise UserError(safe_line(str(exc))) from None
    for line in report.lines():
        print(line)
    return report.exit_code


def run_doctor(args):
    from draftsmith.export.doctor.run import diagnose, diagnose_config

    serve = own_options_first(args)
    if bool(serve) == bool(args.config):
        raise UserError("doctor: give the serve command after `--`, or --config FILE (one of the two), e.g. "
                        "`draftsmith doctor DIR -- vllm serve MODEL --speculative-config '{...}'`")
    if args.config:
        return diagnose_config(args.export_dir, args.config, args.engine_version)
    return diagnose(args.export_dir, serve, args.engine_version)
