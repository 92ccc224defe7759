"""Hidden states captured by vLLM, read as offline features (features.source: vllm, features.dir: DIR), and
written in the same layout (`draftsmith prepare --features --format vllm`).

The layout, as vLLM 0.33.0 writes it (read from the vLLM wheel's source; docs/training-at-scale.md cites it):
  - one safetensors file per request, `<request id>.safetensors`
    (vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py,
    ExampleHiddenStatesConnector._submit_async_write), holding two tensors:
      "hidden_states" [num_tokens, num_layers, hidden_size] in the model's dtype (bf16 / fp16 / fp32),
      "token_ids"     [num_tokens] int64 (the prompt's token ids; with include_output_tokens, all but the last);
  - the layers are the speculative config's `eagle_aux_hidden_state_layer_ids`, in that order
    (vllm/v1/spec_decode/extract_hidden_states.py: torch.stack(target_hidden_states, dim=1));
  - layer id i is the residual stream entering decoder layer i (hidden_states + residual), so id
    num_layers is the last layer's output *before* the final norm
    (vllm/model_executor/models/llama.py, _maybe_add_hidden_state(aux, idx + 1, ...)). These are
    draftsmith's layer ids; draftsmith applies the target's final norm to id num_layers to get the
    post-norm last hidden state its soft labels come from;
  - the zstd variant (the OnlineHiddenStatesConnector's writer, `use_compression`) compresses the whole
    safetensors file as one zstd frame and names it `<request id>.safetensors.zst`.
speculators' reader (hs_connectors.transfer.FileTransfer, speculators 0.9.0) reads `hs_<row>.safetensors`
with the same two tensors and takes the last layer as the verifier's last hidden state; draftsmith writes
that name, with layers = the drafter's aux layer ids + [num_layers].

Rows are matched to the dataset by their token ids (a file whose ids match no row is skipped and counted).
Every file is a received file: a regular file, bounded in size, its header checked before anything is
allocated; a zstd frame must declare its decompressed size, at most MAX_ZSTD_RATIO times the compressed
one (a zstd bomb is one line). Before training, the first matched row is recomputed with the target and
compared with the file: other layers, another layer order, another target or another hidden size are
each refused in one line naming the file.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import stat
from pathlib import Path

import torch

from draftsmith.core.errors import UserError
from draftsmith.core.files import check_safetensors, file_kind, read_json_object, read_received_bytes

HIDDEN, TOKENS = "hidden_states", "token_ids"  # the connector's tensor names
SIDECAR = "draftsmith_vllm.json"  # written by draftsmith beside its files: target fingerprint and layer ids
MAX_FILE_BYTES = 16 * 2**30  # one request's file (32k tokens x 5 layers x 8192 x bf16 is 2.7 GB)
MAX_ZSTD_RATIO = 64  # decompressed / compressed bytes a zstd frame may declare (hidden states compress ~1.1-2x)
MAX_FILES = 10_000_000
FLOAT_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
WRITE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SPOT_CHECK_TOLERANCE = 0.05  # max |file - recomputed| / max |recomputed| on the first row (bf16 on another kernel)


def layer_ids(aux_layers: list[int], num_layers: int, features: list[str]) -> list[int]:
    """The eagle_aux_hidden_state_layer_ids vLLM must capture: the drafter's aux layers, then num_layers
    (the last layer's output, pre-norm) when the drafter needs the last hidden state or the target's logits."""
    ids = list(aux_layers) if "aux_hidden_states" in features else []
    return ids + ([num_layers] if "last_hidden_state" in features else [])


def _is_hidden_states_file(name: str) -> bool:
    return name.endswith(".safetensors") or name.endswith(".safetensors.zst")


def _decompress(path: Path, data: bytes) -> bytes:
    try:
        import zstandard
    except ImportError:
        raise UserError(f"{path}: a zstd-compressed hidden-states file; reading it needs the zstandard package "
                        "(pip install zstandard)") from None
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError:
        raise UserError(f"{path}: not a zstd frame; the file is damaged: capture it again") from None
    bound = min(MAX_FILE_BYTES, MAX_ZSTD_RATIO * len(data))
    if size < 0 or size > bound:
        declared = "no decompressed size" if size < 0 else f"{size:,} decompressed bytes"
        raise UserError(f"{path}: its zstd frame declares {declared}, draftsmith reads at most {bound:,} "
                        f"({MAX_ZSTD_RATIO}x its {len(data):,} compressed bytes): a zstd bomb or a damaged file; "
                        "capture it again")
    try:
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise UserError(f"{path}: the zstd data is damaged ({str(exc)[:120]}); capture it again") from None
    if len(raw) != size:
        raise UserError(f"{path}: decompressed to {len(raw):,} bytes, its frame declared {size:,}; capture it again")
    return raw


def read_file(path: Path, tokens_only: bool = False) -> dict[str, torch.Tensor]:
    """{"hidden_states": [s, L, h], "token_ids": [s] int64} of one file, checked (one line naming it if not).
    tokens_only: of an uncompressed file, read "token_ids" alone ("hidden_states" is then only its shape)."""
    from safetensors import safe_open
    from safetensors.torch import load, load_file

    path = Path(path)
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else file_kind(st.st_mode)
        raise UserError(f"{path}: is {what}, not a regular file; features.dir must hold the hidden-states files "
                        "themselves: replace it with the real file")
    if path.name.endswith(".zst"):
        raw = _decompress(path, read_received_bytes(path, "zstd hidden-states file", MAX_FILE_BYTES))
        header = check_safetensors(path, raw)
    else:
        if st.st_size > MAX_FILE_BYTES:
            raise UserError(f"{path}: {st.st_size:,} bytes, more than the {MAX_FILE_BYTES:,} one request's hidden "
                            "states may take; the file is damaged or not a hidden-states file")
        header, raw = check_safetensors(path), None
    tokens, hidden = header.get(TOKENS), header.get(HIDDEN)
    problem = None
    if not isinstance(tokens, dict) or not isinstance(hidden, dict):
        problem = f"holds {sorted(k for k in header if k != '__metadata__')[:6]}, not {HIDDEN!r} and {TOKENS!r}"
    elif tokens["dtype"] not in ("I64", "I32") or len(tokens["shape"]) != 1:
        problem = f"{TOKENS!r} is {tokens['dtype']} {tokens['shape']}, not a vector of int64 token ids"
    elif hidden["dtype"] not in FLOAT_DTYPES or len(hidden["shape"]) != 3 or hidden["shape"][0] != tokens["shape"][0]:
        problem = (f"{HIDDEN!r} is {hidden['dtype']} {hidden['shape']}, not [{tokens['shape'][0]} tokens, layers, "
                   "hidden size] in bf16, fp16 or fp32")
    if problem:
        raise UserError(f"{path}: {problem}; not a vLLM hidden-states file")
    if tokens_only and raw is None:
        with safe_open(str(path), framework="pt") as f:
            return {HIDDEN: torch.empty(hidden["shape"], device="meta"), TOKENS: f.get_tensor(TOKENS).long()}
    out = load(raw) if raw is not None else load_file(str(path))
    return {HIDDEN: out[HIDDEN], TOKENS: out[TOKENS].long()}


def _key(ids) -> str:
    return hashlib.sha256(torch.as_tensor(ids, dtype=torch.int64).numpy().tobytes()).hexdigest()


def scan(folder: Path, shape: list[int]) -> dict[str, tuple[Path, int]]:
    """{token-ids hash: (file, length)} of every hidden-states file in folder (not recursive); each must hold
    `shape` = [layers, hidden size] per token."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"features.dir {folder}: not a directory; point it at the folder vLLM wrote "
                        "(kv_connector_extra_config.shared_storage_path)")
    out: dict[str, tuple[Path, int]] = {}
    names = sorted(e.name for e in os.scandir(folder) if _is_hidden_states_file(e.name))
    if len(names) > MAX_FILES:
        raise UserError(f"features.dir {folder}: {len(names):,} files, more than the {MAX_FILES:,} draftsmith reads")
    for name in names:
        data = read_file(folder / name, tokens_only=True)
        got = list(data[HIDDEN].shape[1:])
        if got != shape:
            raise UserError(f"{folder / name}: holds {got[0]} layers of hidden size {got[1]}; the recipe needs "
                            f"{shape[0]} layers of hidden size {shape[1]}; capture again with the layer ids and "
                            "target of docs/training-at-scale.md")
        out.setdefault(_key(data[TOKENS]), (folder / name, len(data[TOKENS])))
    return out


def final_norm(target):
    """The target's final norm (applied to layer num_layers to get the post-norm last hidden state)."""
    decoder = target.model.get_decoder() if hasattr(target.model, "get_decoder") else None
    norm = getattr(decoder, "norm", None)
    if norm is None:
        raise UserError(f"target {target.name} ({target.config.model_type}): draftsmith does not know its final norm, "
                        "which vLLM's captured last layer needs; build draftsmith's own cache "
                        "(`draftsmith prepare recipe.yaml --features`) instead")
    return norm


class VllmRows(torch.utils.data.Dataset):
    """Dataset rows whose hidden states sit in vLLM files: the same items as data.feature_cache.CachedDataset."""

    def __init__(self, dataset, matches: list[tuple[int, Path]], layers: list[int], features: list[str],
                 hidden_size: int, norm=None):
        self.dataset, self.matches, self.layers, self.features = dataset, matches, layers, features
        self.hidden_size, self.norm = hidden_size, norm
        self.n_aux = len(layers) - (1 if "last_hidden_state" in features else 0)

    def __len__(self) -> int:
        return len(self.matches)

    def lengths(self) -> list[int]:
        return [len(self.dataset[row]["input_ids"]) for row, _ in self.matches]

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(i)
        row, path = self.matches[i]
        data, item = read_file(path), self.dataset[row]
        hidden = data[HIDDEN]
        if list(hidden.shape[1:]) != [len(self.layers), self.hidden_size] or not torch.equal(data[TOKENS],
                                                                                             item["input_ids"].long()):
            raise UserError(f"{path}: holds {list(hidden.shape)} for other tokens or layers than when training "
                            f"started (layers {self.layers}, hidden {self.hidden_size}); was the folder rewritten?")
        out = {"input_ids": item["input_ids"].long(), "loss_mask": item["loss_mask"].long(), "id": f"vllm:{path.name}"}
        if "aux_hidden_states" in self.features:
            out["aux_hidden_states"] = hidden[:, :self.n_aux].reshape(len(hidden), -1)  # [s, n, h] -> [s, n*h]
        if "last_hidden_state" in self.features:
            with torch.no_grad():
                out["last_hidden_state"] = self.norm(hidden[:, -1].to(self.norm.weight.dtype)).to(hidden.dtype)
        return out


def _check_sidecar(folder: Path, target, ids: list[int]) -> None:
    path = folder / SIDECAR
    if not os.path.lexists(path):
        return
    side = read_json_object(path, "vLLM hidden-states description")
    if not target.matches(side.get("target_fingerprint")):
        raise UserError(f"{path}: the hidden states were captured from target {str(side.get('target'))[:80]!r} "
                        f"(fingerprint {str(side.get('target_fingerprint'))[:40]}), not {target.name!r} (fingerprint "
                        f"{target.fingerprint}); capture them again from this target")
    if side.get("layer_ids") != ids:
        raise UserError(f"{path}: captured layers {str(side.get('layer_ids'))[:80]}, the recipe's drafter needs {ids}; "
                        "capture again with that eagle_aux_hidden_state_layer_ids")


def _row_media(item: dict, device) -> dict:
    """An image row's processor tensors as a batch of one (data/images.py); {} for a text row."""
    from draftsmith.data import features as feats_mod
    from draftsmith.data.dataset import collate

    return {k: v.to(device) for k, v in feats_mod.media_of(collate([item], 0)).items()}


def _spot_check(target, rows: VllmRows, ids: list[int]) -> None:
    """Recompute the first matched row with the target and compare it with the file."""
    from draftsmith.data import features as feats_mod

    row, path = rows.matches[0]
    item = rows[0]
    input_ids = item["input_ids"][None].to(target.device)
    media = _row_media(rows.dataset[row], target.device)  # an image row: recomputed from its pixels
    ref = feats_mod.compute(target, input_ids, torch.ones_like(input_ids), set(rows.features), ids[:rows.n_aux],
                            media=media)
    for name in rows.features:
        want, got = ref[name][0].float().cpu(), item[name].float()
        err = float((want - got).abs().max()) / max(float(want.abs().max()), 1e-6)
        if err > SPOT_CHECK_TOLERANCE:
            raise UserError(f"{path}: its hidden states differ from target {target.name}'s {name} at layer ids {ids} "
                            f"by {err:.3g} (relative; at most {SPOT_CHECK_TOLERANCE} expected): captured from another "
                            "target, with other eagle_aux_hidden_state_layer_ids or in another order; capture again "
                            f"with eagle_aux_hidden_state_layer_ids {ids}")


def open_rows(folder: str, target, aux_layers: list[int], required, datasets: list, log=print) -> list[VllmRows]:
    """One VllmRows per dataset in `datasets` (train, heldout): the rows with a file in folder."""
    from draftsmith.data.feature_cache import cache_features

    folder_path = Path(folder)
    features = cache_features(required)
    ids = layer_ids(aux_layers, target.num_layers, features)
    _check_sidecar(folder_path, target, ids)
    try:
        files = scan(folder_path, [len(ids), target.hidden_size])
    except UserError as exc:
        if "the recipe needs" not in str(exc):
            raise
        raise UserError(f"{exc} (eagle_aux_hidden_state_layer_ids {ids}, target {target.name} of hidden size "
                        f"{target.hidden_size})") from None
    if not files:
        raise UserError(f"features.dir {folder}: no *.safetensors or *.safetensors.zst files; point it at the folder "
                        "vLLM wrote (kv_connector_extra_config.shared_storage_path)")
    norm = None
    if "last_hidden_state" in features:
        norm = copy.deepcopy(final_norm(target)).float().cpu()
    out, used = [], set()
    for dataset in datasets:
        matches = []
        for row in range(len(dataset)):
            hit = files.get(_key(dataset[row]["input_ids"]))
            if hit is not None:
                matches.append((row, hit[0]))
                used.add(hit[0])
        out.append(VllmRows(dataset, matches, ids, features, target.hidden_size, norm))
    total = sum(len(d) for d in datasets)
    matched = sum(len(r) for r in out)
    if matched == 0:
        raise UserError(f"features.dir {folder}: none of its {len(files)} files holds the token ids of a dataset row; "
                        "capture the rows this recipe tokenizes (same data, chat template and max_length)")
    log(f"vLLM hidden states {folder}: {matched} of {total} rows matched by token ids"
        + (f"; {len(files) - len(used)} file(s) match no row" if len(files) > len(used) else "")
        + (f"; {total - matched} row(s) without a file are left out" if matched < total else ""))
    _spot_check(target, next(r for r in out if len(r)), ids)
    return out


# --------------------------------------------------------------------------- writing


def _pre_norm_capture(target):
    """A hook on the final norm that keeps its input (the last layer's output before the norm)."""
    kept = {}
    handle = final_norm(target).register_forward_hook(lambda module, args, out: kept.__setitem__("x", args[0]))
    return kept, handle


@torch.no_grad()
def write_folder(target, dataset, folder: str, aux_layers: list[int], required, dtype: str = "bfloat16",
                 log=print, rank: int = 0, world: int = 1) -> int:
    """Write hs_<row>.safetensors for every row (row % world == rank) in vLLM's layout; -> files written.
    A row whose file already holds its token ids and layers is kept (a rerun resumes)."""
    from safetensors.torch import save_file

    from draftsmith.core.files import disk_full_guard
    from draftsmith.data.feature_cache import cache_features

    if dtype not in WRITE_DTYPES:
        raise UserError(f"features.dtype {dtype}: vLLM's hidden-states files hold bfloat16, float16 or float32; "
                        "set features.dtype to one of those for --format vllm")
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    features = cache_features(required)
    ids = layer_ids(aux_layers, target.num_layers, features)
    side = {"format": "vllm extract_hidden_states", "target": target.name, "target_fingerprint": target.fingerprint,
            "layer_ids": ids, "hidden_size": target.hidden_size, "rows": len(dataset)}
    if rank == 0:
        tmp = root / f"{SIDECAR}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(side, indent=2))
        os.replace(tmp, root / SIDECAR)
    kept, handle = _pre_norm_capture(target) if target.num_layers in ids else ({}, None)
    written = 0
    try:
        for row in range(rank, len(dataset), world):
            path = root / f"hs_{row}.safetensors"
            item = dataset[row]
            ids_row = item["input_ids"].long()
            if path.exists():
                try:
                    old = read_file(path)
                    if torch.equal(old[TOKENS], ids_row) and list(old[HIDDEN].shape[1:]) == [len(ids), target.hidden_size]:
                        continue
                except UserError:
                    pass  # damaged: written again
            x = ids_row[None].to(target.device)
            out = target.forward(x, attention_mask=torch.ones_like(x), **_row_media(item, target.device))
            layers = [kept["x"][0] if i == target.num_layers else out.hidden_states[i][0] for i in ids]
            hidden = torch.stack(layers, dim=1).to("cpu", WRITE_DTYPES[dtype]).contiguous()  # [s, L, h]
            tmp = root / f"hs_{row}.safetensors.tmp-{os.getpid()}"
            try:
                with disk_full_guard(root, f"vLLM hidden-states file {path.name}"):
                    save_file({HIDDEN: hidden, TOKENS: ids_row.contiguous()}, str(tmp))
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            written += 1
    finally:
        if handle is not None:
            handle.remove()
    log(f"vLLM-format hidden states {folder}: {written} file(s) written"
        + (f" by rank {rank} of {world}" if world > 1 else "") + f", layer ids {ids}")
    return written
