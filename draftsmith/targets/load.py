"""Load a target model (local directory, Hugging Face id, a GGUF file, an installed model or the
embedded default), freeze it, and capture its hidden states through the model's own outputs
(output_hidden_states).

GGUF targets: `path` names a `.gguf` file, or a directory holding one (named by `gguf_file` when it
holds several); transformers' GGUF support (the `gguf` package) reads the config, the tokenizer and
the weights, dequantized to `dtype`. `installed:NAME` names a model that a script installs outside the
repository (draftsmith/targets/installed.py; e.g. `installed:gemma3-270m`, scripts/install_gemma3_270m.sh).

Hidden-state convention (the engines' EAGLE-3 convention): layer id i is hidden_states[i]
of the HF outputs, i.e. the input of decoder layer i; hidden_states[0] is the embedding
output. In transformers 5 the last entry, hidden_states[num_layers], is AFTER the final
norm (it is what the lm_head sees).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from huggingface_hub.errors import StrictDataclassError
from torch import nn

from draftsmith.core.errors import UserError
from draftsmith.core.files import refuse_special_file

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "assets"  # draftsmith/assets
GGUF_SUFFIX = ".gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


LEGACY_PREFIX = 4096  # values per tensor the fingerprint covered before every value was hashed
HASH_CHUNK = 1 << 20  # values hashed per step (4 MB as float32)


def hash_values(h, flat: torch.Tensor) -> None:
    """h.update with the float32 bytes of a flat tensor, HASH_CHUNK values at a time (the same digest
    as hashing all bytes at once, without a full-size float32 copy)."""
    for start in range(0, flat.numel(), HASH_CHUNK):
        h.update(flat[start:start + HASH_CHUNK].float().cpu().numpy())  # the array's buffer: no extra bytes copy


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [b, s, V]
    hidden_states: tuple[torch.Tensor, ...]  # num_layers + 1 entries, each [b, s, h]


def resolve_path(path: str) -> str:
    """`builtin:NAME` -> the embedded model directory; `installed:NAME` -> the installed model file (an
    error saying how to install it when it is missing); anything else is returned unchanged."""
    if path.startswith("installed:"):
        from draftsmith.targets import installed

        return str(installed.resolve(path.split(":", 1)[1]))
    if path.startswith("builtin:"):
        name = path.split(":", 1)[1]
        local = BUILTIN_DIR / name
        if not (local / "config.json").exists():
            known = sorted(p.name for p in BUILTIN_DIR.iterdir() if (p / "config.json").exists())
            raise FileNotFoundError(
                f"no embedded target {name!r} in {BUILTIN_DIR} (known: {known}); "
                "rebuild it with `python scripts/build_pycode_target.py`"
            )
        return str(local)
    return path


def locate(path: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """(what from_pretrained reads: a directory or hub id, the GGUF file name inside it or None).

    A `.gguf` path -> (its directory, its name); a directory with `gguf_file` -> that file; a directory
    without config.json holding exactly one `.gguf` -> that one. Anything else is an HF checkpoint."""
    local = resolve_path(path)
    p = Path(local).expanduser()
    if local.endswith(GGUF_SUFFIX):
        if gguf_file:
            raise UserError(f"target.gguf_file {gguf_file!r}: target.path {path!r} already names a GGUF file; "
                             "drop one of them")
        refuse_special_file(p, "target path")
        if not p.is_file():
            raise FileNotFoundError(f"target path {path!r}: no such GGUF file{_install_hint(p.name)}")
        return str(p.parent), p.name
    if gguf_file:
        refuse_special_file(p / gguf_file, "target.gguf_file")
        if not (p / gguf_file).is_file():
            raise FileNotFoundError(f"target.gguf_file {gguf_file!r}: no such file in {local}{_install_hint(gguf_file)}")
        return str(p), gguf_file
    if p.is_dir() and not (p / "config.json").exists():
        found = sorted(f.name for f in p.glob("*" + GGUF_SUFFIX))
        if len(found) == 1:
            return str(p), found[0]
        if found:
            raise UserError(f"target path {path!r} holds {len(found)} GGUF files {found}: name one with "
                             "target.gguf_file (--gguf-file)")
    return local, None


def _install_hint(file_name: str) -> str:
    from draftsmith.targets import installed

    hint = installed.hint_for_file(file_name)
    return f"; {hint}" if hint else "; give the path of an existing .gguf file"


def hf_kwargs(gguf_file: str | None) -> dict:
    """The from_pretrained keyword that reads a GGUF file ({} for an HF checkpoint)."""
    return {"gguf_file": gguf_file} if gguf_file else {}


def gguf_model_kwargs(gguf_file: str | None) -> dict:
    """A model's from_pretrained keywords for a GGUF file: dequantized to plain tensors at load, always.
    draftsmith's drafters share the target's embedding and lm_head and capture its hidden states;
    transformers may otherwise keep the weights packed in GGUF blocks when a matmul kernel exists."""
    if not gguf_file:
        return {}
    from transformers import GgufConfig

    return {"gguf_file": gguf_file, "quantization_config": GgufConfig(dequantize=True)}


def require_gguf_package(path: str) -> None:
    """transformers reads GGUF files through the `gguf` package: a one-line error when it is absent."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise OSError(f"target {path!r} is a GGUF file: install the gguf package (pip install 'gguf==0.19.0', "
                      "a draftsmith dependency)") from None


def resolve_device(device: str) -> torch.device:
    """auto -> cuda when available, else cpu; a device that does not exist here is one line naming it."""
    from draftsmith.core.errors import UserError

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise UserError(f"device {device!r} is not a torch device; give auto, cpu, cuda or cuda:N") from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UserError(f"device {device!r}: CUDA is not available on this machine (this torch: "
                            f"{torch.__version__}); use --device cpu or auto (target.device for a recipe)")
        if resolved.index is not None and resolved.index >= count:
            raise UserError(f"device {device!r}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    return resolved


class Target:
    """A frozen causal LM with its tokenizer, stop ids and a fingerprint; a vision-language target also
    carries its processor (image processor + tokenizer + chat template: data/images.py)."""

    def __init__(self, model: nn.Module, tokenizer, name: str, path: str | None = None,
                 gguf_file: str | None = None, processor=None):
        self.model = model.eval()
        self.processor = processor  # None for a text target
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.name = name  # stable display name: the HF id, builtin:NAME, or a local directory's name
        self.path = path or name  # where it was loaded from, as given
        self.gguf_file = gguf_file  # the GGUF file's absolute path when loaded from one, else None
        self.config = model.config
        self._fingerprint: Optional[str] = None
        self._legacy_fingerprint: Optional[tuple[str, str]] = None

    # ---- shape facts
    @property
    def num_layers(self) -> int:
        from draftsmith.targets.archs import text_config

        return text_config(self.config).num_hidden_layers  # a vision-language target: its text backbone's

    @property
    def hidden_size(self) -> int:
        from draftsmith.targets.archs import text_config

        return text_config(self.config).hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def embed_tokens(self) -> nn.Embedding:
        """The embedding table as raw rows: what a Llama-layer draft (EAGLE, engines' EAGLE drafts)
        looks up with the shared weight. Gemma-3's scaled embedding module multiplies by sqrt(h) in
        its forward (Gemma-2 does so in the model's forward); drafters never see that scale, at
        training or serving (archs.traits records it; exports write it in draftsmith.json)."""
        module = self.model.get_input_embeddings()
        if type(module) is nn.Embedding:
            return module
        if getattr(self, "_raw_embedding", None) is None or self._raw_embedding.weight is not module.weight:
            raw = nn.Embedding(module.num_embeddings, module.embedding_dim, padding_idx=module.padding_idx,
                               device="meta")
            raw.weight = module.weight  # shares the tensor: no copy, stays frozen
            self._raw_embedding = raw
        return self._raw_embedding

    def logits_from_hidden(self, last_hidden_state: torch.Tensor) -> torch.Tensor:
        """[b, s, h] post-norm hidden -> [b, s, V] logits through the target's own output path:
        lm_head, then the transforms its forward applies (Gemma's final soft-capping
        cap * tanh(x / cap), Cohere's logit_scale, Granite's logits_scaling). The offline cache
        checks the result against the target's real logits before trusting it (data/feature_cache)."""
        from draftsmith.targets.archs import logits_transform

        head = self.lm_head
        logits = head(last_hidden_state.to(head.weight.dtype))  # [b, s, h] -> [b, s, V]
        cap, mul, div = logits_transform(self.config)
        if mul:
            logits = logits * mul
        if div:
            logits = logits / div
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @property
    def eos_ids(self) -> list[int]:
        """All stop ids: generation_config's eos list (stories260K: [2, 1]) plus the tokenizer's."""
        from draftsmith.targets.archs import text_config

        ids: list[int] = []
        gen = getattr(self.model, "generation_config", None)
        config_eos = getattr(text_config(self.config), "eos_token_id", None)  # a vision-language target: its text config's
        for source in (getattr(gen, "eos_token_id", None), config_eos, self.tokenizer.eos_token_id):
            if source is None:
                continue
            for i in source if isinstance(source, (list, tuple)) else [source]:
                if i not in ids:
                    ids.append(int(i))
        return ids

    @property
    def fingerprint(self) -> str:
        """sha256 over the config and, per parameter, its name, shape and EVERY value (as float32,
        streamed in chunks of HASH_CHUNK values: a bf16 and an fp32 load of the same bf16 weights
        agree, and no full-size copy is made). The path it was loaded from (config._name_or_path) is
        left out: a copy of the model elsewhere has the same fingerprint."""
        if self._fingerprint is None:
            self._fingerprint = self._hash(with_path=False, prefix=None)
        return self._fingerprint

    @property
    def legacy_fingerprints(self) -> tuple[str, str]:
        """The fingerprint as earlier draftsmith versions computed it (the first 4,096 values of each
        tensor, with and without the load path), which checkpoints and caches written then record."""
        if self._legacy_fingerprint is None:
            self._legacy_fingerprint = (self._hash(with_path=False, prefix=LEGACY_PREFIX),
                                        self._hash(with_path=True, prefix=LEGACY_PREFIX))
        return self._legacy_fingerprint

    @property
    def legacy_fingerprint(self) -> str:
        """The oldest form (first 4,096 values, load path included); see legacy_fingerprints."""
        return self.legacy_fingerprints[1]

    def matches(self, fingerprint: str | None) -> bool:
        """Whether a recorded fingerprint names this model. A fingerprint in a legacy form (written by an
        older draftsmith) only vouches for the first 4,096 values of each tensor; it is still accepted,
        with a note on stderr, so that older checkpoints and caches load."""
        if fingerprint == self.fingerprint:
            return True
        if fingerprint in self.legacy_fingerprints:
            import sys

            print(f"[draftsmith] note: fingerprint {fingerprint} was recorded by an older draftsmith and covers only "
                  f"the first 4,096 values of each of {self.name}'s tensors (re-save to record the full one)",
                  file=sys.stderr)
            return True
        return False

    def _hash(self, with_path: bool, prefix: int | None) -> str:
        h = hashlib.sha256()
        config = self.config.to_dict()
        if not with_path:
            config.pop("_name_or_path", None)
        h.update(json.dumps(config, sort_keys=True, default=str).encode())
        for name, p in self.model.state_dict().items():
            h.update(f"{name}:{tuple(p.shape)}".encode())
            flat = p.detach().reshape(-1)
            hash_values(h, flat if prefix is None else flat[:prefix])
        return h.hexdigest()[:16]

    def identity(self) -> dict:
        """What exports and results record about the verifier."""
        return {
            "name": self.name,
            "path": self.path,
            "architectures": list(getattr(self.config, "architectures", None) or []),
            "model_type": self.config.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "fingerprint": self.fingerprint,
            "num_params": sum(p.numel() for p in self.model.parameters()),
            **({"format": "gguf", "gguf_file": self.gguf_file} if self.gguf_file else {}),
        }

    def position_offset(self):
        """What a text position after the prompt's images is shifted by: Qwen-VL's M-RoPE rope_deltas ([b, 1],
        kept by the model from the prefill), 0 for any other target. A forward given its own position_ids
        (tree verification) adds it, as the model's own decode steps do."""
        return position_offset(self.model)

    # ---- forward
    @torch.no_grad()
    def forward(self, input_ids, attention_mask=None, cache=None, position_ids=None, **media) -> TargetOutput:
        """media: a vision-language target's processor outputs beside the ids (pixel_values, image_grid_thw,
        token_type_ids / mm_token_type_ids). A forward that starts a sequence (no cache, or an empty one) drops
        the M-RoPE offsets a Qwen-VL model kept from the previous request (its rope_deltas), so they are
        computed from this prompt's images; decode steps on the cache reuse them (the language model alone)."""
        forget_position_offset(self.model, cache)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=cache is not None,
            output_hidden_states=True,
            **media,
        )
        return TargetOutput(logits=out.logits, hidden_states=out.hidden_states)


def position_offset(model):
    """A model's M-RoPE offset after an image prompt (Qwen-VL's rope_deltas), else 0 (Target.position_offset)."""
    deltas = getattr(getattr(model, "model", None), "rope_deltas", None)
    return 0 if deltas is None else deltas


def forget_position_offset(model, cache) -> None:
    """A forward that starts a sequence (no cache, or an empty one) drops the offset the previous request left."""
    inner = getattr(model, "model", None)
    if getattr(inner, "rope_deltas", None) is not None and (cache is None or cache.get_seq_length() == 0):
        inner.rope_deltas = None


def load(path: str, dtype: str = "float32", device: str = "auto", revision: str | None = None,
         trust_remote_code: bool = False, gguf_file: str | None = None) -> Target:
    """Load a frozen target. `path` is a local directory, a Hugging Face id, builtin:NAME,
    installed:NAME or a .gguf file (or a directory with one: gguf_file names it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    local, gguf_name = locate(path, gguf_file)
    if looks_local(path) and not Path(local).expanduser().is_dir():
        raise FileNotFoundError(f"target path {path!r}: no such directory; give a local model directory "
                                "(holding config.json), a .gguf file, a Hugging Face id such as org/name, or "
                                "builtin:pycode-tiny")
    if dtype not in DTYPES:
        raise UserError(f"target dtype {dtype!r} is not one of {list(DTYPES)}")
    if gguf_name:
        require_gguf_package(path)
    extra = hf_kwargs(gguf_name)
    check_declared_sizes(local, gguf_name)
    try:
        if gguf_name:
            model = _load_gguf_model(local, gguf_name, DTYPES[dtype])
        elif is_vision_language(local, revision, trust_remote_code):  # the full model: vision tower + language model
            from transformers import AutoModelForImageTextToText

            model = AutoModelForImageTextToText.from_pretrained(local, dtype=DTYPES[dtype], revision=revision,
                                                                trust_remote_code=trust_remote_code)
        else:
            model = AutoModelForCausalLM.from_pretrained(local, dtype=DTYPES[dtype], revision=revision,
                                                         trust_remote_code=trust_remote_code)
    except StrictDataclassError as exc:  # a config.json value of the wrong type (transformers 5 checks them)
        raise config_json_error(local, exc, gguf_name) from exc
    except (OSError, ValueError) as exc:
        if Path(local).expanduser().is_dir():
            raise
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise FileNotFoundError(f"target path {path!r}: no such local directory, and as a Hugging Face id it did not "
                                f"load ({first}); give an existing model directory, or a hub id available online or "
                                "in the local cache") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(local, revision=revision, trust_remote_code=trust_remote_code, **extra)
    except (ValueError, TypeError) as exc:  # a tokenizer.json that is not UTF-8, a special token that is an object
        detail = " ".join(str(exc).split())[:300]
        raise UserError(f"{path}: the target's tokenizer files (tokenizer.json, tokenizer_config.json) do not load: "
                        f"{detail}; restore them from the model's source") from exc
    gguf_path = None
    if gguf_name:
        gguf_path = str((Path(local).expanduser() / gguf_name).resolve())
        _settle_gguf_model(model, gguf_path)
    model.to(resolve_device(device))
    processor = load_processor(path, local, revision, trust_remote_code) if hasattr(model.config, "vision_config") else None
    return Target(model, tokenizer, name=display_name(path, gguf_name), path=path, gguf_file=gguf_path,
                  processor=processor)


PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def is_vision_language(local: str, revision: str | None, trust_remote_code: bool) -> bool:
    """A vision-language config (a vision_config beside its text_config): loaded as image-text-to-text."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(local, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return False  # the model load below reports what is wrong
    return getattr(config, "vision_config", None) is not None


def load_processor(path: str, local: str, revision: str | None, trust_remote_code: bool):
    """A vision-language target's processor (image processor, tokenizer, chat template); None when a local model
    directory has no processor files (the target then reads text rows only)."""
    from transformers import AutoProcessor

    folder = Path(local).expanduser()
    if folder.is_dir() and not any((folder / f).is_file() for f in PROCESSOR_FILES):
        return None
    try:
        return AutoProcessor.from_pretrained(local, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError, ImportError, AttributeError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise UserError(f"target {path}: its processor (images + chat template) does not load ({detail}); restore its "
                        "processor files (preprocessor_config.json, processor_config.json) or install what it "
                        "names (e.g. torchvision for a video processor)") from exc


def _load_gguf_model(local: str, gguf_name: str, dtype) -> nn.Module:
    """A GGUF file's model, every weight read from the file: metadata that declares shapes its tensors do not
    hold (a vocab_size or head_count changed) or a tensor missing (it would start at random) is one line
    naming the file. transformers' multi-line load report and its raw progress bar are kept off stderr."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    file = Path(local).expanduser() / gguf_name
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with _no_gguf_progress_bar():
            model, info = AutoModelForCausalLM.from_pretrained(local, dtype=dtype, output_loading_info=True,
                                                               **gguf_model_kwargs(gguf_name))
    except RuntimeError as exc:  # "size mismatch", or the mismatched keys of the load report
        detail = " ".join(str(exc).split())[:200]
        raise UserError(f"{file}: its metadata declares shapes its tensors do not hold ({detail}); the GGUF file is "
                        "damaged: download or convert it again") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise UserError(f"{file}: {len(missing)} of the model's weights have no tensor in the file (e.g. {missing[0]}), "
                        "so they would start at random; the GGUF file is damaged: download or convert it again")
    return model


@contextlib.contextmanager
def _no_gguf_progress_bar():
    """transformers' GGUF loader draws a raw tqdm bar ("Converting and de-quantizing GGUF tensors...") that
    disable_progress_bar does not reach; on stderr it turned a one-line error after the load into three."""
    from functools import partial

    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bar = getattr(gguf_utils, "tqdm", None)
    if bar is None:
        yield
        return
    gguf_utils.tqdm = partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def _settle_gguf_model(model: nn.Module, gguf_path: str) -> None:
    """A GGUF-loaded model as draftsmith uses it: plain floating-point weights (never packed blocks), no
    quantizer left on it (it makes save_pretrained and peft refuse a dequantized model), and its
    architecture recorded (a GGUF config has none; exports name the verifier's architecture)."""
    packed = [n for n, p in model.named_parameters() if not p.is_floating_point()]
    if packed:
        raise UserError(f"target {gguf_path}: {len(packed)} weights stayed packed in GGUF blocks (e.g. {packed[0]}); "
                         "draftsmith needs them dequantized: update transformers")
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    model.is_quantized = False
    if not getattr(model.config, "architectures", None):
        model.config.architectures = [type(model).__name__]


def check_declared_sizes(local: str, gguf_name: str | None) -> None:
    """Before any model is built: a GGUF header walked with bounds and its tokenizer metadata checked, or a
    checkpoint's config.json (an object, its num_hidden_layers held by its weights); targets/declared.py."""
    from draftsmith.targets import declared

    if gguf_name:
        declared.check_gguf(Path(local).expanduser() / gguf_name)
    else:
        check_config_json(local)
        declared.check_checkpoint_layers(local)


def check_config_json(local: str) -> None:
    """A local target's config.json must be a JSON object (transformers fails on null or a list with a
    TypeError traceback)."""
    file = Path(local).expanduser() / "config.json"
    if not file.is_file():
        return  # a hub id, or a directory without one: transformers names what is missing
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # ValueError: not JSON, or not UTF-8
        raise UserError(f"{file}: not valid JSON ({' '.join(str(exc).split())[:200]}); restore the target's config.json") from exc
    if not isinstance(data, dict):
        raise UserError(f"{file}: a JSON {type(data).__name__}, expected an object; restore the target's config.json")


def config_json_error(local: str, exc: Exception, gguf_name: str | None = None) -> UserError:
    """One line naming the target's config.json and its bad field (huggingface_hub's StrictDataclassError);
    for a GGUF target the .gguf file, whose metadata the config came from (it has no config.json)."""
    detail = " ".join(str(exc).split())[:300]
    if gguf_name:
        return UserError(f"{Path(local) / gguf_name}: its metadata gives a bad config value ({detail}); the GGUF "
                         "file is damaged: download or convert it again")
    return UserError(f"{Path(local) / 'config.json'}: {detail}; fix that value in the target's config.json")


def looks_local(path: str) -> bool:
    """A path no Hugging Face id can be ("org/name" or "name"): absolute, ./ ../ ~, or more than one '/'."""
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or path.endswith("/") or "\\" in path


def display_name(path: str, gguf_file: str | None = None) -> str:
    """The same model loaded through different relative paths gets one name (results group by it):
    a GGUF target is named by its file (gemma-3-270m-q4_k_m.gguf), an installed one installed:NAME."""
    if path.startswith(("builtin:", "installed:")):
        return path
    if gguf_file:
        return Path(gguf_file).name
    if not Path(path).is_dir():
        return path  # a Hugging Face id
    return Path(path).resolve().name


def from_config(cfg) -> Target:
    """Load the target named by a recipe's `target` section."""
    return load(cfg.path, cfg.dtype, cfg.device, cfg.revision, cfg.trust_remote_code,
                gguf_file=getattr(cfg, "gguf_file", None))


def serving_path(cfg) -> str:
    """The target as an engine loads it: a GGUF target's file path (vLLM and llama.cpp take the .gguf
    itself), a builtin target's directory, else target.path as given."""
    local, gguf_name = locate(cfg.path, getattr(cfg, "gguf_file", None))
    return str(Path(local) / gguf_name) if gguf_name else local
