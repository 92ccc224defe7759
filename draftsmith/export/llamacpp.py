"""`draftsmith export CKPT --to llama.cpp --out DIR [--target-gguf FILE]`: GGUF files that llama.cpp
(the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp, built by scripts/install_llama_cpp.sh) serves,
written by llama.cpp's own converter, then loaded by llama-server for one request as the check.

    DIR/draft-eagle3.gguf              EAGLE-3: the speculators-format export (--to vllm) converted with
                                       convert_hf_to_gguf.py --target-model-dir TARGET (arch "eagle3")
    DIR/draft-lm.gguf                  draft LM: the --to hf directory converted as an ordinary model
    DIR/draft-dflash.gguf              DFlash: z-lab's DFlashDraftModel layout, converted with --target-model-dir
    DIR/draft-dspark.gguf              DSpark: speculators' DSparkSpeculator layout, the same way
    DIR/draft-dflash2.gguf             DFlash 2: z-lab's DFlash2DraftModel layout, the same way (all three arch
                                       "dflash"; export/llamacpp_block.py has the layouts and the graph)
    DIR/target-<name>-f32.gguf         the target, converted by the same converter (unless --target-gguf)
    DIR/draftsmith.json                what is which, the serve command, the llama.cpp version, the check
      llama-server -m DIR/target-<name>-f32.gguf -md DIR/draft-eagle3.gguf --spec-type draft-eagle3 --spec-draft-n-max K

What llama.cpp reads (and so what is refused here, in one line each):
  EAGLE-3  src/models/eagle3.cpp + common/speculative.cpp: exactly 3 `extract_layers` (the
           speculators field eagle_aux_hidden_state_layer_ids, same ids as draftsmith: t_layer_inp[i],
           the INPUT of target layer i), concatenated in the order given; norm_before_residual and
           norm_before_fc (a single norm over the fused features, which draftsmith does not train);
           no per-layer fc_norm, no norm_output; SiLU MLP; d2t offsets as in draftsmith. The
           target graph must capture layer inputs (t_layer_inp, set in src/models/<arch>.cpp).
  draft LM draft-simple: any llama.cpp graph, vocabulary compatible with the target's.
  DFlash / DSpark  draft-dflash / draft-dspark: the same feature capture as EAGLE-3 (t_layer_inp), SiLU,
           plain rope, k = one whole block; DFlash with a full vocabulary (z-lab's layout has no d2t),
           DSpark with the target's lm_head when the vocabulary is full (export/llamacpp_block.py).
  Not served: Medusa, the MLP speculator, P-EAGLE, EAGLE-1 (no such --spec-type).
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from draftsmith import __version__
from draftsmith.core.errors import UserError
from draftsmith.export.llamacpp_block import BLOCK_KINDS, block_drafts, block_refusal, check_block_k, write_block_dir

FORMAT = "llama.cpp"
# DFlash 2 runs as draft-dflash: common/speculative.cpp switches to its selector walk when the GGUF has selector_top_k
# (uncut at llama.cpp's default --spec-draft-p-min 0, as draftsmith's walk)
SPEC_TYPES = {"eagle3": "draft-eagle3", "draft_lm": "draft-simple", "dflash": "draft-dflash", "dspark": "draft-dspark",
              "dflash2": "draft-dflash"}
DRAFT_FILES = {"eagle3": "draft-eagle3.gguf", "draft_lm": "draft-lm.gguf", "dflash": "draft-dflash.gguf",
               "dspark": "draft-dspark.gguf", "dflash2": "draft-dflash2.gguf"}
FEATURE_KINDS = ("eagle3", *BLOCK_KINDS)  # drafters fed by the target's layer inputs (t_layer_inp)
KIND_NAMES = {"eagle3": "EAGLE-3", "dflash": "DFlash", "dspark": "DSpark", "dflash2": "DFlash 2"}
NOT_SERVED = {
    "medusa": "llama.cpp has no Medusa heads (its --spec-type values: draft-simple, draft-eagle3, draft-dflash, "
              "draft-dspark, draft-mtp, ngram-*)",
    "mlp_speculator": "llama.cpp has no MLP speculator (its --spec-type values: draft-simple, draft-eagle3, "
                      "draft-dflash, draft-dspark, draft-mtp, ngram-*)",
    "peagle": "llama.cpp has no parallel EAGLE (P-EAGLE) drafting; its draft-eagle3 drafts one token per step",
    "eagle1": "llama.cpp serves EAGLE-3 (three fused target layers), not EAGLE-1",
}
# HF model_type of targets whose llama.cpp graph stores layer inputs for EAGLE-3 (t_layer_inp in
# src/models/{llama,qwen3,qwen3moe,qwen3next,qwen35,qwen35moe,gemma4,openai-moe,deepseek4}.cpp).
FEATURE_CAPTURE = ("llama", "mistral", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe",
                   "gemma4", "gemma4_text", "gpt_oss", "deepseek_v4")


@dataclass
class LlamaCppExport:
    out_dir: Path
    draft: Path
    target: Path
    spec_type: str
    k: int
    serve_command: str
    check: dict  # the llama-server round trip ({} with validate=False)


def refusal(loaded) -> str | None:
    """Why llama.cpp cannot serve this drafter on this target (one line), or None."""
    kind = loaded.drafter.kind
    why = NOT_SERVED.get(kind) or getattr(loaded.drafter, "export_refused", {}).get(FORMAT)
    if why:
        return f"--to llama.cpp does not take {kind} drafters: {why}"
    if kind not in SPEC_TYPES:
        return f"--to llama.cpp does not take {kind} drafters (it takes {sorted(SPEC_TYPES)})"
    window = getattr(getattr(loaded.drafter, "cfg", None), "sliding_window", None)
    if window is not None:  # its draft graphs attend to the whole context
        return (f"--to llama.cpp: this drafter was trained with drafter.sliding_window={window}, which llama.cpp's draft "
                "graphs do not run; export it with --to vllm, or retrain with drafter.sliding_window=null")
    if kind not in FEATURE_KINDS:
        return None
    model_type = str(getattr(loaded.target.config, "model_type", "?"))
    if model_type not in FEATURE_CAPTURE:
        return (f"--to llama.cpp: the target's model_type {model_type!r} has no {KIND_NAMES[kind]} feature capture in llama.cpp "
                f"(its {model_type} graph stores no layer inputs; it does for {', '.join(FEATURE_CAPTURE[:4])}, ...); "
                "serve a draft LM with draft-simple instead, or export --to vllm")
    if kind in BLOCK_KINDS:
        return block_refusal(loaded)
    aux = list(loaded.drafter.aux_layer_ids)
    if len(aux) != 3:
        return (f"--to llama.cpp: drafter.aux_layer_ids {aux} has {len(aux)} ids; llama.cpp's draft-eagle3 reads exactly "
                "3 (src/models/eagle3.cpp); retrain with three aux layers")
    cfg = loaded.drafter.cfg
    for option in ("fc_norm", "norm_output"):
        if getattr(cfg, option, False):
            return (f"--to llama.cpp: this EAGLE-3 drafter was trained with drafter.{option}=true, which llama.cpp's "
                    "eagle3 graph does not run; retrain with it false, or export --to vllm / sglang")
    act = getattr(loaded.drafter.layer_config, "hidden_act", "silu")
    if act != "silu":
        return f"--to llama.cpp: the draft layer's hidden_act {act!r} is not SiLU, the only MLP llama.cpp's eagle3 graph runs"
    return None


def target_dir_of(loaded) -> Path:
    """The target's local HF directory (config.json + tokenizer): the converter reads it."""
    from draftsmith.targets.load import resolve_path

    path = Path(resolve_path(loaded.config.target.path))
    if not (path / "config.json").is_file():
        raise UserError(f"--to llama.cpp needs the target as a local directory (config.json, tokenizer, safetensors); "
                        f"target.path {loaded.config.target.path!r} is not one: download it and pass that directory "
                        "with a recipe override, or eval/export from a checkpoint whose recipe names a directory")
    return path.resolve()


def served_target(loaded, given: Path | None) -> Path | None:
    """The target GGUF llama-server loads: --target-gguf, else a GGUF target's own file (served as it is,
    quantized or not, never converted), else None (the export converts the HF target directory)."""
    if given is not None:
        return given
    own = getattr(loaded.target, "gguf_file", None)
    return Path(own).resolve() if own else None


def target_file_name(target_dir: Path) -> str:
    return f"target-{re.sub(r'[^A-Za-z0-9._-]+', '-', target_dir.name)}-f32.gguf"


def serve_command(tools, target: Path, draft: Path, spec_type: str, k: int) -> str:
    # draft-dspark: p-min 0 sends the whole block (llama.cpp's per-slot confidence cut is not draftsmith's rule)
    p_min = " --spec-draft-p-min 0" if spec_type == "draft-dspark" else ""
    # --no-repack: as in llamacpp_tools.LlamaServer (the build's weight repacking segfaults on Q4_K files here)
    return (f"{shlex.quote(str(tools.server))} -m {shlex.quote(str(target))} -md {shlex.quote(str(draft))} "
            f"--spec-type {spec_type} --spec-draft-n-max {k}{p_min} --no-repack --host 127.0.0.1 --port 8080")


def default_k(drafter) -> int:
    if drafter.kind in BLOCK_KINDS:
        return block_drafts(drafter)
    return int(getattr(drafter.cfg, "ttt_steps", 0) or 5)


def check_k(drafter, k: int) -> None:
    """UserError when llama.cpp would not run `k` drafts per round as draftsmith trained them."""
    if k < 1:
        raise UserError(f"--num-speculative-tokens {k}: must be >= 1")
    if drafter.kind in BLOCK_KINDS:
        check_block_k(drafter, k)


def write_draft_dir(checkpoint, loaded, kind: str, hf_dir: Path, k: int) -> None:
    """The directory llama.cpp's converter reads: speculators EAGLE-3 (--to vllm), the HF draft LM (--to hf),
    or the block drafters' layouts (llamacpp_block.py)."""
    from draftsmith.export.api import export
    from draftsmith.export.common import ExportOptions

    if kind in BLOCK_KINDS:
        write_block_dir(loaded, hf_dir)
    else:
        export(checkpoint, "vllm" if kind == "eagle3" else "hf", hf_dir, ExportOptions(num_speculative_tokens=k),
               loaded=loaded)


def check_with_server(tools, target: Path, draft: Path, spec_type: str, k: int, vocab_size: int) -> dict:
    """Load target + draft in llama-server, one short greedy request; what it reported."""
    from draftsmith.export.llamacpp_tools import LlamaCppError, LlamaServer

    prompt = [1] + [(7 * i + 3) % max(vocab_size - 4, 1) + 3 for i in range(12)]  # BOS-like id, then a spread
    with LlamaServer(tools, target, draft=draft, spec_type=spec_type, k=k, max_requests=1) as srv:
        reply = srv.complete(prompt, max_tokens=16)
    timings = reply["timings"]
    if reply["tokens_predicted"] != 16 or not timings.get("draft_n"):
        raise LlamaCppError(f"llama-server loaded {target.name} + {draft.name} but drafted nothing "
                            f"(tokens_predicted {reply['tokens_predicted']}, timings {timings})")
    return {"loaded": True, "tokens_predicted": reply["tokens_predicted"], "draft_n": timings["draft_n"],
            "draft_n_accepted": timings.get("draft_n_accepted", 0)}


def export_llamacpp(checkpoint, out, target_gguf=None, k: int | None = None, validate: bool = True,
                    overwrite: bool = False, loaded=None) -> LlamaCppExport:
    """Write the GGUF files llama.cpp serves for `checkpoint` into `out` (atomically), checked in llama-server."""
    from draftsmith.checkpoint import load_drafter, write_dir_atomically
    from draftsmith.export.api import check_out_dir, replace_export_files, written_files
    from draftsmith.export.llamacpp_tools import convert, find_llama_cpp
    from draftsmith.export.llamacpp_vocab import adopt_vocabulary

    out = Path(out).resolve()
    source = Path(checkpoint) if checkpoint is not None else None
    replacing = check_out_dir(out, source, overwrite)
    loaded = loaded if loaded is not None else load_drafter(checkpoint)
    why = refusal(loaded)
    if why:
        raise UserError(why)
    given_target = Path(target_gguf).resolve() if target_gguf else None
    if given_target is not None and not given_target.is_file():
        raise UserError(f"--target-gguf {target_gguf}: no such file; give the target's GGUF or omit the flag to convert it")
    kind = loaded.drafter.kind
    spec_type, k = SPEC_TYPES[kind], int(k or default_k(loaded.drafter))
    check_k(loaded.drafter, k)
    tools = find_llama_cpp()
    given_target = served_target(loaded, given_target)
    needs_dir = kind in FEATURE_KINDS or given_target is None  # the converter reads the HF target directory
    target_dir = target_dir_of(loaded) if needs_dir else given_target.parent
    draft_name = DRAFT_FILES[kind]
    target_path = given_target or out / target_file_name(target_dir)
    check: dict = {}

    def fill(tmp: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="draftsmith-llamacpp-") as work:
            hf_dir = Path(work) / "hf"  # the directory llama.cpp's converter reads
            write_draft_dir(checkpoint, loaded, kind, hf_dir, k)
            convert(tools, hf_dir, tmp / draft_name, target_dir=target_dir if kind in FEATURE_KINDS else None)
        if given_target is None:
            convert(tools, target_dir, tmp / target_path.name)
        if kind == "draft_lm":  # llama.cpp drafts only with the target's exact vocabulary (llamacpp_vocab.py)
            adopt_vocabulary(tmp / draft_name, given_target or tmp / target_path.name)
        if validate:  # the files as written, before they reach `out`
            local_target = given_target or tmp / target_path.name
            check.update(check_with_server(tools, local_target, tmp / draft_name, spec_type, k,
                                           int(loaded.target.vocab_size)))
        files = sorted(set(written_files(tmp)) | {"draftsmith.json"})
        sidecar = {
            "format": FORMAT, "engine": "llama.cpp", "llama_cpp": {"sdist": "llama-cpp-python==0.3.36",
                                                                   "server_version": tools.version()},
            "drafter_kind": kind, "spec_type": spec_type, "num_speculative_tokens": k,
            "draft": draft_name, "target": target_path.name if given_target is None else str(given_target),
            "target_converted_by_draftsmith": given_target is None, "target_dir": str(target_dir),
            "aux_layer_ids": list(getattr(loaded.drafter, "aux_layer_ids", []) or []),
            "serve_command": serve_command(tools, target_path, out / draft_name, spec_type, k),
            "check": check or None, "checkpoint": str(checkpoint), "draftsmith_version": __version__, "files": files,
        }
        (tmp / "draftsmith.json").write_text(json.dumps(sidecar, indent=2) + "\n")

    if not replacing:
        write_dir_atomically(out, fill, marker=None)
    else:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            fill(tmp)
            replace_export_files(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return LlamaCppExport(out_dir=out, draft=out / draft_name, target=target_path, spec_type=spec_type, k=k,
                          serve_command=serve_command(tools, target_path, out / draft_name, spec_type, k), check=check)


def read_export_dir(directory) -> dict:
    """draftsmith.json of a --to llama.cpp export, with absolute `draft` / `target` paths."""
    directory = Path(directory)
    try:
        side = json.loads((directory / "draftsmith.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{directory}: no readable draftsmith.json ({exc}); pass a directory written by "
                        "`draftsmith export CKPT --to llama.cpp --out DIR`") from exc
    if side.get("format") != FORMAT:
        raise UserError(f"{directory}/draftsmith.json: format {side.get('format')!r} is not {FORMAT!r}; "
                        "export with --to llama.cpp")
    side["draft"] = str((directory / side["draft"]).resolve())
    side["target"] = str((directory / side["target"]).resolve())  # an absolute --target-gguf stays as it is
    return side


def main(args) -> int:
    """`draftsmith export CKPT --to llama.cpp` (export/cli.py hands over here)."""
    import sys

    from draftsmith.export.common import ExportValidationError

    try:
        result = export_llamacpp(args.checkpoint, args.out, target_gguf=args.target_gguf,
                                 k=args.num_speculative_tokens, validate=not args.no_validate, overwrite=args.overwrite)
    except (ExportValidationError, FileExistsError, FileNotFoundError, ValueError, OSError) as exc:
        print(f"draftsmith export: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    state = (f"loaded by llama-server: drafted {result.check['draft_n']}, accepted {result.check['draft_n_accepted']}"
             if result.check else "NOT checked in llama-server (--no-validate)")
    print(f"exported {args.checkpoint} -> {result.out_dir} (llama.cpp {result.spec_type}; {state})")
    print(f"  draft  {result.draft}\n  target {result.target}")
    print("serve it with:")
    print(f"  {result.serve_command}")
    return 0
