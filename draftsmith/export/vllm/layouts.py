"""vLLM formats: EAGLE-3 in the speculators format, Medusa, and the MLP speculator.

EAGLE-3 (speculators 0.9.0 Eagle3SpeculatorConfig; vLLM's transformers_utils/configs/speculators):
  config.json  speculators_model_type "eagle3", architectures ["Eagle3Speculator"], draft_vocab_size,
               norm_before_residual, fc_norm, norm_output (EAGLE 3.1, from the drafter's options; all written
               explicitly: vLLM defaults a missing norm_before_residual to TRUE), target_hidden_size,
               eagle_aux_hidden_state_layer_ids (vLLM ids = draftsmith ids: the input of layer i),
               transformer_layer_config (the draft layer's Llama config, rope and max positions from the
               target), speculators_config {algorithm, default_proposal_method, proposal_methods
               [{proposal_type, speculative_tokens, ...}], verifier {architectures, name_or_path}}
  tensors      layers.0.* instead of midlayer.*, fc, fc_norm.{i} (fc_norm only), norm, lm_head, d2t, t2d, and embed_tokens.weight (the
               target's, as speculators' own save writes it: its loader leaves NaN embeddings otherwise)
      vllm serve VERIFIER --speculative-config '{"model": OUT, "num_speculative_tokens": K, "method": "eagle3"}'
Medusa (vllm/model_executor/models/medusa.py): model_type "medusa", num_heads, num_hidden_layers,
  hidden_size, vocab_size, truncated_vocab_size, medusa_fc_bias true (without it vLLM builds the blocks
  bias-free and drops the trained biases silently); tensors blocks.{i}.layers.{j}.weight/.bias, lm_heads.{i}.weight.
  A draft vocabulary (drafter.draft_vocab_size = T): truncated_vocab_size T, lm_heads.{i} [T, h] and token_map
  [T] int64 (the draft ids); per-head heads load in vLLM 0.9.2 only, one shared head (original_lm_head, frozen
  projections) in 0.9.2, 0.20 and 0.27: export/vllm/medusa_vocab.py says where in vLLM's loader each fact was read.
  No num_lookahead_tokens key: vLLM's MedusaConfig maps it onto num_heads, and vLLM sets it to
  num_speculative_tokens, so K must be <= num_heads (more would build heads that no tensor fills).
  Medusa-2 (lora: true): the heads go to model.safetensors, the peft adapter to adapter/; the heads read
  the ADAPTED target's states, so the verifier must be served with the adapter merged (serve command says how).
MLP speculator (vllm/model_executor/models/mlp_speculator.py): model_type "mlp_speculator", emb_dim,
  inner_dim, n_predict, top_k_tokens_per_head, n_candidates, tie_weights, scale_input; tensors emb.{i},
  proj.{i}, head.{i}, ln.{i} (a tied model stores emb.0, proj.0, proj.1, head.0, ln.0). vLLM builds
  num_lookahead_tokens (= num_speculative_tokens) stages, so K must be <= n_predict.
DFlash / DSpark (block drafters), P-EAGLE: the speculators layouts in export/vllm/parallel.py; K <= one block's drafts.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from draftsmith.core.errors import UserError
from draftsmith.core.files import read_json_object
from draftsmith.core.flags import flag
from draftsmith.export import engine_versions
from draftsmith.export.eagle_tensors import (
    check_eagle3_aux_count,
    eagle3_from_weights,
    eagle3_norm_problems,
    eagle3_tensor_spec,
    eagle3_weights,
)
from draftsmith.export.exporter import Exporter
from draftsmith.export.layout import (
    DTYPES,
    EXPORTERS,
    LLAMA_KEYS,
    SIDECAR_FILE,
    ExportFiles,
    ExportOptions,
    Layout,
    TensorSpec,
    cast_floats,
    dtype_name,
    export_dtype,
    layouts,
    llama_fields,
    num_tokens,
    read_export,
    rename,
    sidecar,
    verifier_name,
    window_fields,
    window_problems,
)
from draftsmith.export.speculators import (
    SPECULATORS_VERSION,
    embedding_problems,
    load_plain,
    proposal_problems,
    speculators_config,
)
from draftsmith.export.vllm import doctor as vllm_doctor
from draftsmith.export.vllm import medusa_vocab

ADAPTER_DIR = "adapter"  # Medusa-2: the peft adapter the verifier must be served merged with


def is_medusa2(drafter) -> bool:
    """A Medusa drafter trained with its LoRA adapter (asked of medusa drafters only)."""
    return bool(drafter.cfg.lora)


@dataclass
class VLLMFlags:
    """--to vllm's own flags (both read by the DSpark layout only: vLLM's DSpark speculative-config fields)."""

    # serve with a fixed K instead of vLLM's adaptive verification (enable_adaptive_verification, vLLM >= 0.28), the
    # feature that makes the trained confidence head set each round's verify length
    no_adaptive_verification: bool = flag(
        False, about="vLLM's DSpark speculative-config fields",
        help="vllm dspark: serve with a fixed K instead of vLLM's adaptive verification (which the trained confidence "
             "head drives; vLLM >= 0.28)")
    # vLLM's dspark_draft_topk (>= 0.28): the Markov bias is added to the top-k base logits only (faster, may change
    # drafts, never the output); None: the full projection, as draftsmith trains and evaluates
    dspark_draft_topk: Optional[int] = flag(None, about="vLLM's DSpark speculative-config fields",
                                            help="vllm dspark: vLLM's dspark_draft_topk (Markov bias on the top-k base logits only)")


@EXPORTERS.register("vllm")
class VLLMExporter(Exporter):
    """vLLM: one layout per kind (eagle3, medusa, mlp_speculator here; the block drafters and P-EAGLE in parallel.py)."""

    name = "vllm"
    engine = "vLLM"
    Flags = VLLMFlags
    doctor = vllm_doctor


class VLLMLayout(Layout):
    """What every vLLM layout shares: K, the sidecar and the `vllm serve --speculative-config` command."""

    @property
    def method(self) -> str | None:
        """The --speculative-config method: the kind's name (eagle3, medusa, ...; the kind this layout is
        registered for) unless a layout names another (EAGLE-1: "eagle")."""
        return self.kind
    limit_option: str | None = None  # drafter.OPTION that bounds K (heads, stages, depths); None: no bound
    serve_fields: dict = {}  # more --speculative-config fields (P-EAGLE: parallel_drafting)

    def default_k(self, cfg) -> int:
        """K when --num-speculative-tokens is not given (cfg: the drafter's Config): the option that bounds it
        (layouts without one override)."""
        if self.limit_option is None:
            raise NotImplementedError
        return getattr(cfg, self.limit_option)

    def check_k(self, cfg, k: int) -> None:
        """vLLM builds K = num_speculative_tokens heads / stages / depths: more than were trained would
        run heads that no tensor fills."""
        if self.limit_option is None:
            return
        n = getattr(cfg, self.limit_option)
        if k > n:
            what = self.limit_option
            raise UserError(f"--num-speculative-tokens {k} exceeds the {self.kind} drafter's {what} = {n}: vLLM "
                             f"would build {k} heads and leave {k - n} of them uninitialised; pass "
                             f"--num-speculative-tokens <= {n} or retrain with more (drafter.{what})")

    def files(self, loaded, dtype: torch.dtype, k: int, opts: ExportOptions) -> tuple[dict, dict]:
        """(config.json, tensors) of this layout."""
        raise NotImplementedError

    def build(self, loaded, opts: ExportOptions, out_dir: Path) -> ExportFiles:
        dtype = export_dtype(loaded, opts)
        k = num_tokens(loaded, opts, self.default_k(loaded.drafter.cfg))
        self.check_k(loaded.drafter.cfg, k)
        config, tensors = self.files(loaded, dtype, k, opts)
        side = sidecar(loaded, self.name, self.engine, opts, {"num_speculative_tokens": k})
        return ExportFiles(config=config, tensors=tensors, sidecar=side)

    def llama_fields(self, config: dict) -> dict | None:
        return None  # no draft attention layer (Medusa, MLP speculator); the speculators layouts override

    def load_back(self, export_dir: Path, loaded):
        _, _, tensors = read_export(export_dir)
        return load_plain(tensors, loaded, str(export_dir))

    def reference_drafter(self, loaded, dtype: torch.dtype):
        return load_plain(cast_floats(loaded.drafter.state_dict_for_export(), dtype), loaded, "trained drafter")

    def serve_command(self, out_dir: Path, loaded, opts: ExportOptions) -> str:
        spec = json.dumps({"model": str(out_dir), "num_speculative_tokens": self.k(loaded, opts),
                           **({"method": self.method} if self.method else {}), **self.serve_fields})
        return f"vllm serve {shlex.quote(verifier_name(loaded, opts))} --speculative-config {shlex.quote(spec)}"

    def k(self, loaded, opts: ExportOptions) -> int:
        return num_tokens(loaded, opts, self.default_k(loaded.drafter.cfg))


@layouts("vllm").register("eagle3")
class VLLMEagle3Layout(VLLMLayout):
    """EAGLE-3 in the speculators format (see the module docstring)."""

    carries_vocab_map = True

    def default_k(self, cfg) -> int:
        return self.drafter_class.tokens_per_round(cfg)

    def files(self, loaded, dtype, k, opts):
        d, target = loaded.drafter, loaded.target
        check_eagle3_aux_count(d.aux_layer_ids, "vLLM")
        layer = {"architectures": ["LlamaForCausalLM"], **llama_fields(d.layer_config, target.config, dtype),
                 **window_fields(d, 1)}  # drafter.sliding_window: vLLM's Llama attention reads layer_types
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": self.kind,
            "speculators_version": SPECULATORS_VERSION,
            "draft_vocab_size": int(d.d2t.shape[0]),
            # written explicitly: vLLM defaults a missing norm_before_residual to true
            "norm_before_residual": d.eagle31_norms(d.cfg)["norm_before_residual"],  # P-EAGLE: all off
            "norm_before_fc": False,
            "fc_norm": d.eagle31_norms(d.cfg)["fc_norm"],
            "norm_output": d.eagle31_norms(d.cfg)["norm_output"],
            "target_hidden_size": target.hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(d.aux_layer_ids),
            "transformer_layer_config": layer,
            "speculators_config": speculators_config(loaded, opts, self.kind, k),
            "torch_dtype": dtype_name(dtype),
            "dtype": dtype_name(dtype),
        }
        tensors = rename(eagle3_weights(loaded, dtype), "midlayer.", "layers.0.")
        tensors["embed_tokens.weight"] = target.embed_tokens.weight.detach().to(dtype).cpu().contiguous()
        return config, tensors

    def required_config_keys(self) -> list[str]:
        return ["architectures", "speculators_model_type", "draft_vocab_size", "norm_before_residual",
                "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
                *(f"transformer_layer_config.{k}" for k in LLAMA_KEYS),
                "speculators_config.algorithm", "speculators_config.default_proposal_method",
                "speculators_config.proposal_methods", "speculators_config.verifier.name_or_path",
                "speculators_config.verifier.architectures", "torch_dtype"]

    def expected_tensors(self, config: dict) -> dict[str, TensorSpec]:
        return eagle3_tensor_spec(
            config["transformer_layer_config"], config["draft_vocab_size"],
            len(config["eagle_aux_hidden_state_layer_ids"]), config["target_hidden_size"], "layers.0.",
            DTYPES[config["torch_dtype"]], with_t2d=True, with_embed=True, fc_norm=bool(config.get("fc_norm")),
        )

    def llama_fields(self, config: dict) -> dict | None:
        return config.get("transformer_layer_config")

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        problems = []
        if config["architectures"] != ["Eagle3Speculator"] or config["speculators_model_type"] != self.kind:
            problems.append(f"config.json: needs architectures ['Eagle3Speculator'] and speculators_model_type {self.kind!r}")
        problems += eagle3_norm_problems(config, loaded.drafter)
        if config.get("norm_before_fc"):
            problems.append("config.json: norm_before_fc must be false (draftsmith's EAGLE-3 has no input_norm)")
        if config["eagle_aux_hidden_state_layer_ids"] != list(loaded.drafter.aux_layer_ids):
            problems.append(f"config.json: eagle_aux_hidden_state_layer_ids {config['eagle_aux_hidden_state_layer_ids']}"
                            f" != the trained feature layers {loaded.drafter.aux_layer_ids}")
        problems += proposal_problems(config)
        problems += window_problems(config["transformer_layer_config"], loaded.drafter, 1)
        return problems + embedding_problems(tensors, loaded.target.embed_tokens, "the target's")

    def load_back(self, export_dir: Path, loaded):
        _, _, tensors = read_export(export_dir)
        weights = rename(tensors, "layers.0.", "midlayer.")
        weights.pop("embed_tokens.weight")  # the target's; checked in check_format
        return eagle3_from_weights(weights, loaded, str(export_dir))

    def reference_drafter(self, loaded, dtype: torch.dtype):
        return eagle3_from_weights(eagle3_weights(loaded, dtype), loaded, "trained drafter")


@layouts("vllm").register("medusa")
class MedusaLayout(VLLMLayout):
    """vllm/model_executor/models/medusa.py (see the module docstring); Medusa-2 adds adapter/."""

    limit_option = "num_heads"

    def build(self, loaded, opts: ExportOptions, out_dir: Path) -> ExportFiles:
        files = super().build(loaded, opts, out_dir)
        if is_medusa2(loaded.drafter):
            files.writer = lambda directory: loaded.drafter.save_adapter(directory / ADAPTER_DIR)
            files.sidecar.update(adapter=ADAPTER_DIR, serve_requires_merged_adapter=True)
        return files

    def files(self, loaded, dtype, k, opts):
        d, target = loaded.drafter, loaded.target
        if d.cfg.next_token_head:
            raise UserError("export --to vllm: this Medusa drafter has drafter.next_token_head=true (head i predicts "
                             "the token i+1 after the state, head 0 the target's own next token), while vLLM's head i "
                             "proposes the token i+2 after it; retrain with drafter.next_token_head=false")
        vocab = {"truncated_vocab_size": target.vocab_size, "original_lm_head": False}
        if d.cfg.draft_vocab_size:  # truncated_vocab_size and token_map (export/vllm/medusa_vocab.py)
            vocab = medusa_vocab.vocab_fields(d, engine_versions.resolve("vllm", opts.engine_version))
        config = {
            "architectures": ["MedusaModel"],
            "model_type": self.kind,
            "num_heads": d.cfg.num_heads,
            "num_hidden_layers": d.cfg.num_layers,
            "hidden_size": target.hidden_size,
            "vocab_size": target.vocab_size,
            "truncated_vocab_size": vocab["truncated_vocab_size"],
            "medusa_fc_bias": True,
            "original_lm_head": vocab["original_lm_head"],
            "max_paths": 64,
            "topk": 10,
            "torch_dtype": dtype_name(dtype),
            "dtype": dtype_name(dtype),
        }
        weights = cast_floats(d.state_dict_for_export(), dtype)
        if d.cfg.draft_vocab_size:
            weights = medusa_vocab.export_tensors(d, weights, vocab["original_lm_head"])
        return config, weights

    def required_config_keys(self) -> list[str]:
        return ["model_type", "num_heads", "num_hidden_layers", "hidden_size", "vocab_size",
                "truncated_vocab_size", "medusa_fc_bias", "torch_dtype"]

    def expected_tensors(self, config: dict) -> dict[str, TensorSpec]:
        dtype = DTYPES[config["torch_dtype"]]
        h, T = config["hidden_size"], config["truncated_vocab_size"]
        spec = {}
        for i in range(config["num_heads"]):
            for j in range(config["num_hidden_layers"]):
                spec[f"blocks.{i}.layers.{j}.weight"] = TensorSpec((h, h), dtype)
                if config["medusa_fc_bias"]:
                    spec[f"blocks.{i}.layers.{j}.bias"] = TensorSpec((h,), dtype)
            if i == 0 or not config.get("original_lm_head"):  # original_lm_head: vLLM loads lm_heads.0 only
                spec[f"lm_heads.{i}.weight"] = TensorSpec((T, h), dtype)
        if T < config["vocab_size"]:  # vLLM's loader asserts a token_map then (export/vllm/medusa_vocab.py)
            spec["token_map"] = TensorSpec((T,), torch.int64)
        return spec

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        return check_medusa(export_dir, config, loaded, tensors, self.kind)

    def load_back(self, export_dir: Path, loaded):
        config, _, tensors = read_export(export_dir)
        weights = medusa_vocab.drafter_weights(tensors, config, loaded.drafter.cfg.num_heads)
        return load_plain(weights, loaded, str(export_dir), without_lora=is_medusa2(loaded.drafter))

    def reference_drafter(self, loaded, dtype: torch.dtype):
        d = loaded.drafter
        weights = d.state_dict_for_export() | ({"d2t": d.d2t} if d.cfg.draft_vocab_size else {})
        return load_plain(cast_floats(weights, dtype), loaded, "trained drafter", without_lora=is_medusa2(d))

    def serve_command(self, out_dir: Path, loaded, opts: ExportOptions) -> str:
        if not is_medusa2(loaded.drafter):
            return super().serve_command(out_dir, loaded, opts)
        spec = json.dumps({"model": str(out_dir), "num_speculative_tokens": self.k(loaded, opts), "method": self.method})
        verifier = verifier_name(loaded, opts)
        merged = str(out_dir.parent / f"{out_dir.name}-verifier-merged")
        merge = (f"from peft import PeftModel; from transformers import AutoModelForCausalLM as M, AutoTokenizer as T; "
                 f"PeftModel.from_pretrained(M.from_pretrained({verifier!r}), {str(out_dir / ADAPTER_DIR)!r})"
                 f".merge_and_unload().save_pretrained({merged!r}); T.from_pretrained({verifier!r}).save_pretrained({merged!r})")
        return (f"# Medusa-2: the heads read the ADAPTED target's states: serve the verifier with {ADAPTER_DIR}/ merged\n"
                f"python -c {shlex.quote(merge)}\n"
                f"vllm serve {shlex.quote(merged)} --speculative-config {shlex.quote(spec)}")


@layouts("vllm").register("mlp_speculator")
class MLPSpeculatorLayout(VLLMLayout):
    """vllm/model_executor/models/mlp_speculator.py (see the module docstring)."""

    limit_option = "n_predict"

    def files(self, loaded, dtype, k, opts):
        d, target = loaded.drafter, loaded.target
        c = d.cfg
        config = {
            "architectures": ["MLPSpeculatorPreTrainedModel"],
            "model_type": self.kind,
            "vocab_size": target.vocab_size,
            "emb_dim": target.hidden_size,
            "inner_dim": d.inner_dim,
            "n_predict": c.n_predict,
            "top_k_tokens_per_head": [1] * c.n_predict,
            "n_candidates": 1,
            "tie_weights": c.tie_weights,
            "scale_input": c.scale_input,
            "num_lookahead_tokens": c.n_predict,
            "torch_dtype": dtype_name(dtype),
            "dtype": dtype_name(dtype),
        }
        return config, cast_floats(d.state_dict_for_export(), dtype)

    def required_config_keys(self) -> list[str]:
        return ["architectures", "model_type", "vocab_size", "emb_dim", "inner_dim", "n_predict",
                "top_k_tokens_per_head", "n_candidates", "tie_weights", "scale_input", "torch_dtype"]

    def expected_tensors(self, config: dict) -> dict[str, TensorSpec]:
        return mlp_tensor_spec(config, DTYPES[config["torch_dtype"]])

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        return check_mlp(config, loaded, self.kind)


def mlp_tensor_spec(config: dict, dtype: torch.dtype) -> dict[str, TensorSpec]:
    n, V, h = config["n_predict"], config["vocab_size"], config["emb_dim"]
    d = config["inner_dim"] or h
    stored = 1 if config["tie_weights"] else n
    projs = min(2, n) if config["tie_weights"] else n
    spec = {}
    for i in range(stored):
        spec[f"emb.{i}.weight"] = TensorSpec((V, d), dtype)
        spec[f"head.{i}.weight"] = TensorSpec((V, d), dtype)
        spec[f"ln.{i}.weight"] = TensorSpec((d,), dtype)
        spec[f"ln.{i}.bias"] = TensorSpec((d,), dtype)
    for i in range(projs):
        spec[f"proj.{i}.weight"] = TensorSpec((d, h if i == 0 else d), dtype)
    return spec


def _mismatches(config: dict, want: dict) -> list[str]:
    return [f"config.json: {key} is {config.get(key)!r}, expected {value!r}"
            for key, value in want.items() if config.get(key) != value]


def check_medusa(export_dir: Path, config: dict, loaded, tensors: dict, model_type: str) -> list[str]:
    """Medusa config.json against the trained heads and vLLM's MedusaConfig; a draft vocabulary's
    truncated_vocab_size / token_map as vLLM's loader reads them (export/vllm/medusa_vocab.py); the Medusa-2 adapter."""
    d, target = loaded.drafter, loaded.target
    problems = _mismatches(config, {
        "architectures": ["MedusaModel"], "model_type": model_type, "num_heads": d.cfg.num_heads,
        "num_hidden_layers": d.cfg.num_layers, "hidden_size": target.hidden_size, "vocab_size": target.vocab_size,
        # vLLM's heads project onto truncated_vocab_size rows; below vocab_size it maps them through token_map
        "truncated_vocab_size": d.cfg.draft_vocab_size or target.vocab_size,
    })
    if d.cfg.num_layers > 0 and config.get("medusa_fc_bias") is not True:
        problems.append("config.json: medusa_fc_bias must be true: draftsmith's residual blocks have biases, and vLLM "
                        "builds bias-free blocks (dropping them) without it")
    side = read_json_object(Path(export_dir) / SIDECAR_FILE, "export's draftsmith.json")
    problems += medusa_vocab.layout_problems(config, d, side.get("engine_version"))
    if d.cfg.draft_vocab_size:
        problems += medusa_vocab.token_map_problems(tensors, d)
    if "num_lookahead_tokens" in config and config["num_lookahead_tokens"] != d.cfg.num_heads:
        problems.append(f"config.json: num_lookahead_tokens {config['num_lookahead_tokens']} would reset vLLM's "
                        f"num_heads (MedusaConfig maps one onto the other); drop it or set it to {d.cfg.num_heads}")
    if is_medusa2(d):
        problems += check_medusa2_adapter(Path(export_dir), loaded)
    return problems


@torch.no_grad()
def check_medusa2_adapter(export_dir: Path, loaded) -> list[str]:
    """adapter/ must be a peft adapter that, applied to the target, computes what the drafter's adapted
    target computed in training (the states the heads were trained on)."""
    from peft import PeftModel

    from draftsmith.heads.medusa import shared_weight_copy

    adapter = export_dir / ADAPTER_DIR
    if not (adapter / "adapter_config.json").exists():
        return [f"{adapter}: no peft adapter (adapter_config.json); a Medusa-2 export needs the LoRA adapter its "
                "heads were trained with (MedusaDrafter.save_adapter)"]
    try:
        model = PeftModel.from_pretrained(shared_weight_copy(loaded.target.model), str(adapter)).eval()
    except (ValueError, KeyError, RuntimeError, OSError) as exc:
        return [f"{adapter}: peft cannot load the adapter onto the target ({exc})"]
    ids = torch.arange(3, 3 + 12, device=loaded.target.device).remainder(loaded.target.vocab_size)[None]  # [1, 12]
    want = loaded.drafter.adapted[0](input_ids=ids).logits
    got = model(input_ids=ids).logits
    if not torch.allclose(got.float(), want.float(), rtol=1e-4, atol=1e-5):
        err = float((got.float() - want.float()).abs().max())
        return [f"{adapter}: the adapter applied to the target gives logits up to {err:.3g} away from the trained "
                "Medusa-2 adapter's; it is not the adapter these heads were trained with"]
    return []


def check_mlp(config: dict, loaded, model_type: str) -> list[str]:
    """MLP speculator config.json against the trained stages and vLLM's MLPSpeculatorConfig."""
    d, target = loaded.drafter, loaded.target
    c = d.cfg
    problems = _mismatches(config, {
        "architectures": ["MLPSpeculatorPreTrainedModel"], "model_type": model_type,
        "vocab_size": target.vocab_size, "emb_dim": target.hidden_size, "inner_dim": d.inner_dim,
        "n_predict": c.n_predict, "tie_weights": c.tie_weights, "scale_input": c.scale_input,
    })
    if len(config.get("top_k_tokens_per_head") or []) != c.n_predict:
        problems.append(f"config.json: top_k_tokens_per_head {config.get('top_k_tokens_per_head')} needs one entry per "
                        f"stage ({c.n_predict}): vLLM's MLPSpeculatorConfig asserts it")
    if config.get("num_lookahead_tokens", c.n_predict) != c.n_predict:
        problems.append(f"config.json: num_lookahead_tokens {config['num_lookahead_tokens']} != n_predict {c.n_predict} "
                        "(vLLM builds that many stages)")
    return problems

