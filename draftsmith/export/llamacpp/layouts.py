"""`draftsmith export CKPT --to llama.cpp --out DIR [--target-gguf FILE]`: GGUF files that llama.cpp
(the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp, built by scripts/install_llama_cpp.sh) serves,
written by llama.cpp's own converter, then loaded by llama-server for one request as the check.

    DIR/draft-eagle3.gguf              EAGLE-3: the speculators-format export (--to vllm) converted with
                                       convert_hf_to_gguf.py --target-model-dir TARGET (arch "eagle3")
    DIR/draft-lm.gguf                  draft LM: the --to hf directory converted as an ordinary model
    DIR/draft-dflash.gguf              DFlash: z-lab's DFlashDraftModel layout, converted with --target-model-dir
    DIR/draft-dspark.gguf              DSpark: speculators' DSparkSpeculator layout, the same way
    DIR/draft-dflash2.gguf             DFlash 2: z-lab's DFlash2DraftModel layout, the same way (all three arch
                                       "dflash"; export/llamacpp/block.py has the layouts and the graph)
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
           DSpark with the target's lm_head when the vocabulary is full (export/llamacpp/block.py).
  Not served: Medusa, the MLP speculator, P-EAGLE, EAGLE-1 (no such --spec-type; REFUSED below).

The format is one registered exporter (EXPORTERS["llama.cpp"]) with one layout per kind (EAGLE-3 and the draft
LM here, the block drafters in export/llamacpp/block.py); `draftsmith export --to llama.cpp` runs through
api.export like every format (out-dir checks, atomic write), and the validate hook is the llama-server check.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional

from draftsmith import __version__
from draftsmith import config as config_mod
from draftsmith.core.errors import UserError
from draftsmith.core.files import refuse_special_file
from draftsmith.core.flags import flag
from draftsmith.export.exporter import Exporter
from draftsmith.export.layout import (
    EXPORTERS,
    REFUSED,
    ExportFiles,
    ExportOptions,
    Layout,
    flags_of,
    layouts,
    not_taken,
)
from draftsmith.export.llamacpp import doctor as llamacpp_doctor
from draftsmith.export.llamacpp.tools import GGUF_TYPES

FORMAT = "llama.cpp"
_SPEC_TYPES = "its --spec-type values: draft-simple, draft-eagle3, draft-dflash, draft-dspark, draft-mtp, ngram-*"
REFUSED.register(FORMAT, "medusa", f"llama.cpp has no Medusa heads ({_SPEC_TYPES})")
REFUSED.register(FORMAT, "mlp_speculator", f"llama.cpp has no MLP speculator ({_SPEC_TYPES})")
REFUSED.register(FORMAT, "peagle", "llama.cpp has no parallel EAGLE (P-EAGLE) drafting; its draft-eagle3 drafts one "
                                   "token per step")
REFUSED.register(FORMAT, "eagle1", "llama.cpp serves EAGLE-3 (three fused target layers), not EAGLE-1")
# HF model_type of targets whose llama.cpp graph stores layer inputs for EAGLE-3 (t_layer_inp in
# src/models/{llama,qwen3,qwen3moe,qwen3next,qwen35,qwen35moe,lfm2,nemotron-h,gemma4,openai-moe,deepseek4}.cpp).
# Qwen3.5's text-only config (qwen3_5_text, Qwen3_5ForCausalLM) converts to the same qwen35 graph as the VLM
# checkpoint (conversion/qwen.py registers both); common/speculative.cpp keeps the boundary row of a recurrent or
# hybrid target (llama_model_is_recurrent / llama_model_is_hybrid). Without t_layer_inp: falcon-h1, granite-hybrid,
# kimi-linear, gemma3, qwen2vl, qwen3vl.
FEATURE_CAPTURE = ("llama", "mistral", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text",
                   "qwen3_5_moe_text", "lfm2", "nemotron_h", "gemma4", "gemma4_text", "gpt_oss", "deepseek_v4")


@dataclass
class LlamaCppExport:
    out_dir: Path
    draft: Path
    target: Path
    spec_type: str
    k: int
    serve_command: str
    check: dict  # the llama-server round trip ({} with validate=False)


@dataclass
class Plan:
    """What one export converts and serves, settled before any file is written."""

    tools: object  # llamacpp/tools.LlamaCppTools
    k: int
    given_target: Path | None  # the target GGUF served as it is (--target-gguf, a GGUF target), else None
    target_dir: Path  # the HF target directory the converter reads
    target_path: Path  # the target GGUF llama-server loads


def layout_of(kind: str) -> "LlamaCppLayout":
    """The llama.cpp layout registered for `kind` (UserError naming why when there is none)."""
    return EXPORTERS.get(FORMAT)().layout(kind)


def refusal(loaded) -> str | None:
    """Why llama.cpp cannot serve this drafter on this target (one line), or None."""
    kind = loaded.drafter.kind
    return not_taken(FORMAT, kind) or layout_of(kind).refusal(loaded)


def default_k(drafter) -> int:
    return layout_of(drafter.kind).default_k(drafter.cfg)


def check_k(drafter, k: int) -> None:
    """UserError when llama.cpp would not run `k` drafts per round as draftsmith trained them."""
    layout_of(drafter.kind).check_k(drafter.cfg, k)


def engine_drafter_options(kind: str) -> dict:
    """Drafter options draftsmith's side of `eval --engine` runs with to apply the rule llama.cpp applies."""
    return layout_of(kind).engine_drafter_options if kind in layouts(FORMAT) else {}


def gguf_problems(draft_gguf: Path, drafter) -> list[str]:
    """The draft GGUF's metadata against the trained drafter (what llama.cpp would read differently)."""
    return layout_of(drafter.kind).gguf_problems(draft_gguf, drafter)


class LlamaCppLayout(Layout):
    """One kind as llama.cpp serves it: the HF directory its converter reads, the --spec-type, the draft GGUF's
    name and what llama.cpp cannot run exactly (one line each)."""

    title: ClassVar[str] = ""  # the drafter's name in messages
    reads_target_features: ClassVar[bool] = True  # fed by the target's layer inputs (t_layer_inp)
    # eval --engine: drafter options draftsmith's side runs with to apply the rule llama.cpp applies
    engine_drafter_options: ClassVar[dict] = {}

    @property
    def spec_type(self) -> str:
        return f"draft-{self.kind}"

    @property
    def draft_file(self) -> str:
        return f"draft-{self.kind}.gguf"

    def refusals(self, target_config) -> list[str]:
        return self.capture_refusals(target_config)

    def capture_refusals(self, target_config) -> list[str]:
        """A kind fed by the target's layer inputs needs a target graph that stores them."""
        if not self.reads_target_features:
            return []
        model_type = str(getattr(target_config, "model_type", "?"))
        if model_type in FEATURE_CAPTURE:
            return []
        return [f"--to llama.cpp: the target's model_type {model_type!r} has no {self.title} feature capture in llama.cpp "
                f"(its {model_type} graph stores no layer inputs; it does for {', '.join(FEATURE_CAPTURE[:4])}, ...); "
                "serve a draft LM with draft-simple instead, or export --to vllm"]

    def refusal(self, loaded) -> str | None:
        """Why llama.cpp cannot serve this trained drafter on this target (one line), or None."""
        window = loaded.drafter.attention_window(loaded.drafter.cfg)
        if window is not None:  # its draft graphs attend to the whole context
            return (f"--to llama.cpp: this drafter was trained with drafter.sliding_window={window}, which llama.cpp's "
                    "draft graphs do not run; export it with --to vllm, or retrain with drafter.sliding_window=null")
        captured = self.capture_refusals(loaded.target.config)
        return captured[0] if captured else self.drafter_refusal(loaded)

    def drafter_refusal(self, loaded) -> str | None:
        """What this kind's graph cannot run of this trained drafter (one line), or None."""
        return None

    def default_k(self, cfg) -> int:
        return self.drafter_class.tokens_per_round(cfg) or 5  # a draft LM has no trained number: 5

    def check_k(self, cfg, k: int) -> None:
        if k < 1:
            raise UserError(f"--num-speculative-tokens {k}: llama.cpp drafts at least 1 token a round "
                            f"(--spec-draft-n-max); give 1 or more, or omit it for this drafter's default")

    def write_source(self, loaded, hf_dir: Path, k: int) -> None:
        """The directory llama.cpp's converter reads."""
        raise NotImplementedError

    def finish(self, draft: Path, target: Path) -> None:
        """After conversion: fix what the draft GGUF must share with the target's."""

    def gguf_problems(self, draft_gguf: Path, drafter) -> list[str]:
        return []

    def check_loaded(self, loaded, opts: ExportOptions) -> None:
        why = self.refusal(loaded)
        if why:
            raise UserError(why)
        self.plan(loaded, opts, Path("."))  # --target-gguf, k, the tools and the target directory, before any file

    def plan(self, loaded, opts: ExportOptions, out_dir: Path) -> Plan:
        from draftsmith.export.llamacpp.tools import find_llama_cpp

        target_gguf = flags_of(self.name, opts).target_gguf
        if target_gguf:
            refuse_special_file(target_gguf, "--target-gguf")  # a FIFO, device or directory says what it is
        given = Path(target_gguf).resolve() if target_gguf else None
        if given is not None and not given.is_file():
            raise UserError(f"--target-gguf {target_gguf}: no such file; give the target's GGUF or omit the flag "
                            "to convert it")
        k = self.default_k(loaded.drafter.cfg) if opts.num_speculative_tokens is None else int(opts.num_speculative_tokens)
        self.check_k(loaded.drafter.cfg, k)
        tools = find_llama_cpp()
        given = served_target(loaded, given)
        needs_dir = self.reads_target_features or given is None  # the converter reads the HF target directory
        target_dir = target_dir_of(loaded) if needs_dir else given.parent
        if target_dir is None:  # a GGUF target: its config and tokenizer are written for the converter at build
            return Plan(tools, k, given, None, given)
        return Plan(tools, k, given, target_dir, given or out_dir / target_file_name(target_dir))

    def build(self, loaded, opts: ExportOptions, out_dir: Path, checkpoint=None) -> ExportFiles:
        p = self.plan(loaded, opts, out_dir)

        def write(tmp: Path) -> None:
            from draftsmith.export.llamacpp.tools import convert, write_draft

            with tempfile.TemporaryDirectory(prefix="draftsmith-llamacpp-") as work:
                hf_dir = Path(work) / "hf"  # the directory llama.cpp's converter reads
                self.write_source(loaded, hf_dir, p.k)
                target_dir = p.target_dir or write_gguf_target_dir(loaded, Path(work) / "target")
                write_draft(p.tools, hf_dir, tmp / self.draft_file, flags_of(self.name, opts).gguf_type,
                            target_dir=target_dir if self.reads_target_features else None)
            if p.given_target is None:
                convert(p.tools, p.target_dir, tmp / p.target_path.name)
            self.finish(tmp / self.draft_file, p.given_target or tmp / p.target_path.name)
            if p.target_dir is None:  # the tokenizer transformers rebuilt from the GGUF: take the file's own
                from draftsmith.export.llamacpp.vocab import adopt_vocabulary

                adopt_vocabulary(tmp / self.draft_file, p.given_target)

        sidecar = {
            "format": FORMAT, "engine": "llama.cpp", "llama_cpp": {"sdist": "llama-cpp-python==0.3.36",
                                                                   "server_version": p.tools.version()},
            "drafter_kind": self.kind, "spec_type": self.spec_type, "num_speculative_tokens": p.k,
            "draft": self.draft_file, "draft_gguf_type": flags_of(self.name, opts).gguf_type or "f32",
            "target": p.target_path.name if p.given_target is None else str(p.given_target),
            "target_converted_by_draftsmith": p.given_target is None, "target_dir": str(p.target_dir or GGUF_TARGET_DIR),
            "aux_layer_ids": list(getattr(loaded.drafter, "aux_layer_ids", []) or []),
            "recipe": config_mod.to_dict(loaded.config),  # the drafter options `draftsmith doctor` checks k against
            "serve_command": None, "check": None,
            "checkpoint": str(checkpoint) if checkpoint is None or isinstance(checkpoint, (str, os.PathLike)) else None,
            "draftsmith_version": __version__,
        }
        return ExportFiles(config={}, tensors={}, sidecar=sidecar, writer=write)

    def serve_command(self, out_dir: Path, loaded, opts: ExportOptions) -> str:
        p = self.plan(loaded, opts, out_dir)
        return serve_command(p.tools, p.target_path, out_dir / self.draft_file, self.spec_type, p.k)


@dataclass
class LlamaCppFlags:
    """--to llama.cpp's own flags."""

    # the target's existing GGUF; None: the export converts the target
    target_gguf: Optional[str] = flag(None, help="llama.cpp: the target's existing GGUF (default: convert the target into --out)")
    # the draft GGUF's tensor type: f32 / f16 / bf16 / q8_0 are written by llama.cpp's converter, q4_0 by its
    # llama-quantize from the f32 file; None: f32
    gguf_type: Optional[str] = flag(None, choices=list(GGUF_TYPES), about="the draft GGUF's tensor type",
                                    help="llama.cpp: the draft GGUF's tensor type (default f32; q8_0 by llama.cpp's converter, "
                                         "q4_0 by its llama-quantize)")


@EXPORTERS.register(FORMAT)
class LlamaCppExporter(Exporter):
    """GGUF files llama.cpp serves, written by its own converter; validated by loading them in llama-server."""

    name = FORMAT
    engine = "llama.cpp"
    Flags = LlamaCppFlags
    checked_in_process = False  # llama-server checks it (tests/export/test_llamacpp_roundtrip.py)
    copies_profile = False  # the serve command carries k (--spec-draft-n-max); no profile is copied
    doctor = llamacpp_doctor

    def build(self, loaded, opts: ExportOptions, out_dir: Path, checkpoint=None) -> ExportFiles:
        return self.layout(loaded.drafter.kind).build(loaded, opts, out_dir, checkpoint)  # the sidecar names it

    def check_options(self, opts: ExportOptions) -> None:
        if opts.engine_version:
            raise UserError("--engine-version applies to --to vllm and --to sglang, not --to llama.cpp (the llama.cpp "
                            "export is checked by loading it in the pinned llama-server)")

    def validate(self, export_dir: Path, loaded, opts: ExportOptions, files: ExportFiles) -> dict:
        """The validate hook: load target + draft in llama-server for one request (check_with_server)."""
        from draftsmith.export.llamacpp.tools import find_llama_cpp

        side = files.sidecar
        target = export_dir / side["target"] if side["target_converted_by_draftsmith"] else Path(side["target"])
        side["check"] = check_with_server(find_llama_cpp(), target, export_dir / side["draft"], side["spec_type"],
                                          side["num_speculative_tokens"], int(loaded.target.vocab_size))
        return side["check"]

    def summary(self, checkpoint, result) -> list[str]:
        side, check = result.sidecar, result.report
        state = (f"loaded by llama-server: drafted {check['draft_n']}, accepted {check['draft_n_accepted']}"
                 if check else "NOT checked in llama-server (--no-validate)")
        return [f"exported {checkpoint} -> {result.out_dir} (llama.cpp {side['spec_type']}; {state})",
                f"  draft  {result.out_dir / side['draft']}\n  target {result.out_dir / side['target']}"]


class ConvertedLayout(LlamaCppLayout):
    """A kind whose converter input is another format's export (source_format), written and validated as such."""

    source_format: ClassVar[str] = ""

    def write_source(self, loaded, hf_dir: Path, k: int) -> None:
        write_format_dir(self.source_format, loaded, hf_dir, k)


@layouts(FORMAT).register("eagle3")
class LlamaCppEagle3Layout(ConvertedLayout):
    """EAGLE-3: the speculators-format export (--to vllm) converted with --target-model-dir (arch "eagle3")."""

    title = "EAGLE-3"
    source_format = "vllm"

    def drafter_refusal(self, loaded) -> str | None:
        aux = list(loaded.drafter.aux_layer_ids)
        if len(aux) != 3:
            return (f"--to llama.cpp: drafter.aux_layer_ids {aux} has {len(aux)} ids; llama.cpp's draft-eagle3 reads "
                    "exactly 3 (src/models/eagle3.cpp); retrain with three aux layers")
        norms = loaded.drafter.eagle31_norms(loaded.drafter.cfg)
        for option in ("fc_norm", "norm_output"):
            if norms[option]:
                return (f"--to llama.cpp: this EAGLE-3 drafter was trained with drafter.{option}=true, which llama.cpp's "
                        "eagle3 graph does not run; retrain with it false, or export --to vllm / sglang")
        act = getattr(loaded.drafter.layer_config, "hidden_act", "silu")
        if act != "silu":
            return f"--to llama.cpp: the draft layer's hidden_act {act!r} is not SiLU, the only MLP llama.cpp's eagle3 graph runs"
        return None

    def gguf_problems(self, draft_gguf: Path, drafter) -> list[str]:
        """The draft GGUF's EAGLE-3 metadata against the trained drafter's options (via the gguf package)."""
        from gguf import GGUFReader

        reader = GGUFReader(str(draft_gguf))
        fields = {name: f.contents() for name, f in reader.fields.items() if name.startswith("eagle3.")}
        problems = []
        layers = next((v for k, v in fields.items() if k.endswith(".target_layers") or k.endswith(".extract_layers")),
                      None)
        if layers is not None and list(layers) != list(drafter.aux_layer_ids):
            problems.append(f"aux ids: the draft GGUF extracts target layers {list(layers)}, the drafter was trained on "
                            f"{list(drafter.aux_layer_ids)}")
        nbr = fields.get("eagle3.norm_before_residual")
        if nbr is not None and bool(nbr) != bool(drafter.cfg.norm_before_residual):
            problems.append(f"norms: the draft GGUF has norm_before_residual={bool(nbr)}, the drafter was trained with "
                            f"{bool(drafter.cfg.norm_before_residual)}")
        return problems


@layouts(FORMAT).register("draft_lm")
class LlamaCppDraftLMLayout(ConvertedLayout):
    """A draft LM: the --to hf directory converted as an ordinary model, served with draft-simple."""

    title = "draft LM"
    source_format = "hf"
    reads_target_features = False
    spec_type = "draft-simple"
    draft_file = "draft-lm.gguf"

    def finish(self, draft: Path, target: Path) -> None:
        from draftsmith.export.llamacpp.vocab import adopt_vocabulary

        adopt_vocabulary(draft, target)  # llama.cpp drafts only with the target's exact vocabulary


def write_format_dir(fmt: str, loaded, directory: Path, k: int) -> None:
    """Another format's files for the converter (EAGLE-3: --to vllm, a draft LM: --to hf), validated as that
    format validates them (the converter then reads them)."""
    from draftsmith.export.api import write_files

    exporter = EXPORTERS.get(fmt)()
    opts = ExportOptions(num_speculative_tokens=k, flags=exporter.typed_flags({}))  # that format's default flags
    files = exporter.build(loaded, opts, directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_files(files, directory)
    exporter.validate(directory, loaded, opts, files)


GGUF_TARGET_DIR = "(a GGUF target: its config.json and tokenizer as transformers read them, written for the converter)"


def target_dir_of(loaded) -> Path | None:
    """The target's local HF directory (config.json + tokenizer): the converter reads it. None for a GGUF
    target (write_gguf_target_dir writes what the converter reads from the loaded target)."""
    from draftsmith.targets.load import resolve_path

    if getattr(loaded.target, "gguf_file", None):
        return None
    path = Path(resolve_path(loaded.config.target.path))
    if not (path / "config.json").is_file():
        raise UserError(f"--to llama.cpp needs the target as a local directory (config.json, tokenizer, safetensors); "
                        f"target.path {loaded.config.target.path!r} is not one: download it and pass that directory "
                        "with a recipe override, or eval/export from a checkpoint whose recipe names a directory")
    return path.resolve()


def write_gguf_target_dir(loaded, directory: Path) -> Path:
    """What llama.cpp's converter reads from --target-model-dir (EAGLE-3: config.json's vocab_size,
    num_hidden_layers and hidden_size; the tokenizer), for a target loaded from a GGUF file: its config and
    tokenizer as transformers rebuilt them. The draft then takes the GGUF's own tokenizer metadata
    (adopt_vocabulary), so llama.cpp sees the target's exact vocabulary."""
    directory.mkdir(parents=True, exist_ok=True)
    loaded.target.config.to_json_file(str(directory / "config.json"))
    loaded.target.tokenizer.save_pretrained(str(directory))
    return directory


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
    # --no-repack: as in llamacpp/tools.LlamaServer (the build's weight repacking segfaults on Q4_K files here)
    return (f"{shlex.quote(str(tools.server))} -m {shlex.quote(str(target))} -md {shlex.quote(str(draft))} "
            f"--spec-type {spec_type} --spec-draft-n-max {k}{p_min} --no-repack --host 127.0.0.1 --port 8080")


def check_with_server(tools, target: Path, draft: Path, spec_type: str, k: int, vocab_size: int) -> dict:
    """Load target + draft in llama-server, one short greedy request; what it reported."""
    from draftsmith.export.llamacpp.tools import LlamaCppError, LlamaServer

    prompt = [1] + [(7 * i + 3) % max(vocab_size - 4, 1) + 3 for i in range(12)]  # BOS-like id, then a spread
    with LlamaServer(tools, target, draft=draft, spec_type=spec_type, k=k, max_requests=1) as srv:
        reply = srv.complete(prompt, max_tokens=16)
    timings = reply["timings"]
    if reply["tokens_predicted"] != 16 or not timings.get("draft_n"):
        raise LlamaCppError(f"llama-server loaded {target.name} + {draft.name} but drafted nothing "
                            f"(tokens_predicted {reply['tokens_predicted']}, timings {timings})")
    return {"loaded": True, "tokens_predicted": reply["tokens_predicted"], "draft_n": timings["draft_n"],
            "draft_n_accepted": timings.get("draft_n_accepted", 0)}


def read_export_dir(directory) -> dict:
    """draftsmith.json of a --to llama.cpp export (a received file: bounded, checked), with absolute `draft` /
    `target` paths. The draft GGUF must lie inside the export; the target inside it, or, where the export was
    given --target-gguf, a regular .gguf file elsewhere (export records that path as given)."""
    from draftsmith.core.files import read_json_object

    directory = Path(directory)
    sidecar = directory / "draftsmith.json"
    if not sidecar.is_file():
        raise UserError(f"{directory}: no draftsmith.json; pass a directory written by "
                        "`draftsmith export CKPT --to llama.cpp --out DIR`")
    side = read_json_object(sidecar, "llama.cpp export's draftsmith.json")
    fix = "export again with `draftsmith export CKPT --to llama.cpp --out DIR`"
    if side.get("format") != FORMAT:
        raise UserError(f"{sidecar}: format {str(side.get('format'))[:60]!r} is not {FORMAT!r}; {fix}")
    for key in ("draft", "target", "spec_type", "drafter_kind"):
        if not isinstance(side.get(key), str) or not side[key] or len(side[key]) > 4096:
            raise UserError(f"{sidecar}: `{key}` must be a non-empty string, got {json.dumps(side.get(key))[:60]}; {fix}")
    root = directory.resolve()
    for key in ("draft", "target"):
        path = (directory / side[key]).resolve()
        inside = path.is_relative_to(root)
        if not inside and (key == "draft" or not Path(side[key]).is_absolute() or path.suffix != ".gguf"):
            raise UserError(f"{sidecar}: `{key}` {side[key][:120]!r} points outside the export; a received export "
                            f"names its own files; {fix}")
        if not path.is_file():
            raise UserError(f"{sidecar}: `{key}` {side[key][:120]!r} is not a regular file; {fix}")
        side[key] = str(path)
    return side


def export_llamacpp(checkpoint, out, target_gguf=None, k: int | None = None, validate: bool = True,
                    overwrite: bool = False, loaded=None) -> LlamaCppExport:
    """`export(checkpoint, "llama.cpp", out)` (api.export), described as the GGUF files it wrote."""
    from draftsmith.export.api import export

    result = export(checkpoint, FORMAT, out, ExportOptions(num_speculative_tokens=k, flags={"target_gguf": target_gguf}),
                    validate=validate, overwrite=overwrite, loaded=loaded)
    side = result.sidecar
    return LlamaCppExport(out_dir=result.out_dir, draft=result.out_dir / side["draft"],
                          target=result.out_dir / side["target"], spec_type=side["spec_type"],
                          k=side["num_speculative_tokens"], serve_command=result.serve_command, check=result.report)
