"""Load a target model (local directory, Hugging Face id, or the embedded default), freeze it,
and capture its hidden states through the model's own outputs (output_hidden_states).

Hidden-state convention (the engines' EAGLE-3 convention): layer id i is hidden_states[i]
of the HF outputs, i.e. the input of decoder layer i; hidden_states[0] is the embedding
output. In transformers 5 the last entry, hidden_states[num_layers], is AFTER the final
norm (it is what the lm_head sees).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from huggingface_hub.errors import StrictDataclassError
from torch import nn

from draftsmith.errors import UserError

BUILTIN_DIR = Path(__file__).parent / "assets"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [b, s, V]
    hidden_states: tuple[torch.Tensor, ...]  # num_layers + 1 entries, each [b, s, h]


def resolve_path(path: str) -> str:
    """`builtin:NAME` -> the embedded model directory; anything else is returned unchanged."""
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


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class Target:
    """A frozen causal LM with its tokenizer, stop ids and a fingerprint."""

    def __init__(self, model: nn.Module, tokenizer, name: str, path: str | None = None):
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.name = name  # stable display name: the HF id, builtin:NAME, or a local directory's name
        self.path = path or name  # where it was loaded from, as given
        self.config = model.config
        self._fingerprint: Optional[str] = None
        self._legacy_fingerprint: Optional[str] = None

    # ---- shape facts
    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

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
        from draftsmith.archs import logits_transform

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
        ids: list[int] = []
        gen = getattr(self.model, "generation_config", None)
        for source in (getattr(gen, "eos_token_id", None), self.config.eos_token_id, self.tokenizer.eos_token_id):
            if source is None:
                continue
            for i in source if isinstance(source, (list, tuple)) else [source]:
                if i not in ids:
                    ids.append(int(i))
        return ids

    @property
    def fingerprint(self) -> str:
        """sha256 over the config and, per parameter, its name, shape and first 4096 values. The
        path it was loaded from (config._name_or_path) is left out: a copy of the model elsewhere
        has the same fingerprint."""
        if self._fingerprint is None:
            self._fingerprint = self._hash(with_path=False)
        return self._fingerprint

    @property
    def legacy_fingerprint(self) -> str:
        """The fingerprint as draftsmith computed it before leaving the load path out."""
        if self._legacy_fingerprint is None:
            self._legacy_fingerprint = self._hash(with_path=True)
        return self._legacy_fingerprint

    def matches(self, fingerprint: str | None) -> bool:
        """Whether a recorded fingerprint names this model (also in the legacy form that checkpoints
        and caches written before then record)."""
        return fingerprint == self.fingerprint or fingerprint == self.legacy_fingerprint

    def _hash(self, with_path: bool) -> str:
        h = hashlib.sha256()
        config = self.config.to_dict()
        if not with_path:
            config.pop("_name_or_path", None)
        h.update(json.dumps(config, sort_keys=True, default=str).encode())
        for name, p in self.model.state_dict().items():
            h.update(f"{name}:{tuple(p.shape)}".encode())
            h.update(p.detach().flatten()[:4096].float().cpu().numpy().tobytes())
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
        }

    # ---- forward
    @torch.no_grad()
    def forward(self, input_ids, attention_mask=None, cache=None, position_ids=None) -> TargetOutput:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=cache is not None,
            output_hidden_states=True,
        )
        return TargetOutput(logits=out.logits, hidden_states=out.hidden_states)


def load(path: str, dtype: str = "float32", device: str = "auto", revision: str | None = None,
         trust_remote_code: bool = False) -> Target:
    """Load a frozen target. `path` is a local directory, a Hugging Face id or builtin:NAME."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    local = resolve_path(path)
    if looks_local(path) and not Path(local).expanduser().is_dir():
        raise FileNotFoundError(f"target path {path!r}: no such directory; give a local model directory "
                                "(holding config.json), a Hugging Face id such as org/name, or builtin:pycode-tiny")
    if dtype not in DTYPES:
        raise ValueError(f"target dtype {dtype!r} is not one of {list(DTYPES)}")
    check_config_json(local)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            local, dtype=DTYPES[dtype], revision=revision, trust_remote_code=trust_remote_code
        )
    except StrictDataclassError as exc:  # a config.json value of the wrong type (transformers 5 checks them)
        raise config_json_error(local, exc) from exc
    except (OSError, ValueError) as exc:
        if Path(local).expanduser().is_dir():
            raise
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise FileNotFoundError(f"target path {path!r}: no such local directory, and as a Hugging Face id it did not "
                                f"load ({first}); give an existing model directory, or a hub id available online or "
                                "in the local cache") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(local, revision=revision, trust_remote_code=trust_remote_code)
    except (ValueError, TypeError) as exc:  # a tokenizer.json that is not UTF-8, a special token that is an object
        detail = " ".join(str(exc).split())[:300]
        raise UserError(f"{path}: the target's tokenizer files (tokenizer.json, tokenizer_config.json) do not load: "
                        f"{detail}; restore them from the model's source") from exc
    model.to(resolve_device(device))
    return Target(model, tokenizer, name=display_name(path), path=path)


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


def config_json_error(local: str, exc: Exception) -> UserError:
    """One line naming the target's config.json and its bad field (huggingface_hub's StrictDataclassError)."""
    detail = " ".join(str(exc).split())[:300]
    return UserError(f"{Path(local) / 'config.json'}: {detail}; fix that value in the target's config.json")


def looks_local(path: str) -> bool:
    """A path no Hugging Face id can be ("org/name" or "name"): absolute, ./ ../ ~, or more than one '/'."""
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or path.endswith("/") or "\\" in path


def display_name(path: str) -> str:
    """The same model loaded through different relative paths gets one name (results group by it)."""
    if path.startswith("builtin:") or not Path(path).is_dir():
        return path  # builtin:NAME or a Hugging Face id
    return Path(path).resolve().name


def from_config(cfg) -> Target:
    """Load the target named by a recipe's `target` section."""
    return load(cfg.path, cfg.dtype, cfg.device, cfg.revision, cfg.trust_remote_code)
