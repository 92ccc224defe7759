"""Data sources read through the `datasets` library, next to the JSON/JSONL/text files:

    data.path: ["hf:ORG/NAME"]                                   # a Hugging Face dataset, split train
    data.path: ["hf:ORG/NAME?split=test&config=en&revision=v1"]  # split / config (subset) / revision
    data.path: ["corpus/part-0.parquet", "corpus/*.arrow"]       # parquet and arrow files
    data.path: ["corpus_saved/"]                                 # a Dataset.save_to_disk folder (?split=... for a DatasetDict)

A Hugging Face dataset is served from the local caches first: the hub download cache
(HF_HUB_CACHE, or HF_HOME/hub: what `load_dataset` or `huggingface-cli download` left there) and
then, when online, the hub itself. Offline (HF_HUB_OFFLINE=1 or HF_DATASETS_OFFLINE=1) a dataset
that is not cached is a one-line error saying how to fetch it.

Rows keep their place for the data report: "SOURCE:INDEX" with INDEX counted from 0 in the split
(files: from 0 in the file), e.g. "hf:acme/chats[train]:17" or "part-0.parquet:3".
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qsl

from draftsmith.core.errors import UserError

HF_PREFIX = "hf:"
TABLE_SUFFIXES = (".parquet", ".arrow")
SPEC_KEYS = ("split", "config", "revision")


def is_hf(path: str) -> bool:
    return path.startswith(HF_PREFIX)


def split_query(path: str) -> tuple[str, dict]:
    """'x?split=a&config=b' -> ('x', {'split': 'a', 'config': 'b'}); unknown keys are an error."""
    base, _, query = path.partition("?")
    params = dict(parse_qsl(query, keep_blank_values=False)) if query else {}
    unknown = sorted(set(params) - set(SPEC_KEYS))
    if unknown:
        raise UserError(f"data.path {path!r}: unknown option(s) {unknown}; known: {list(SPEC_KEYS)} "
                         "(e.g. hf:ORG/NAME?split=train&config=default&revision=main)")
    return base, params


def is_saved_dataset(path: str) -> bool:
    """A Dataset.save_to_disk / DatasetDict.save_to_disk folder."""
    base = split_query(path)[0]
    return os.path.isdir(base) and any((Path(base) / f).exists() for f in ("state.json", "dataset_dict.json"))


def is_table_file(path: str) -> bool:
    return split_query(path)[0].endswith(TABLE_SUFFIXES)


def is_dataset_source(path: str) -> bool:
    return is_hf(path) or is_table_file(path) or is_saved_dataset(path)


def hub_cache_dir() -> str | None:
    """Read at call time (huggingface_hub reads its constants once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None


def offline() -> bool:
    import datasets
    from huggingface_hub import constants

    env = any(os.environ.get(k, "").lower() in ("1", "true", "yes", "on") for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    return env or bool(constants.HF_HUB_OFFLINE) or bool(getattr(datasets.config, "HF_HUB_OFFLINE", False))


def _load_hf(path: str):
    import datasets
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    base, params = split_query(path)
    name = base[len(HF_PREFIX):]
    if name.count("/") != 1:
        raise UserError(f"data.path {path!r}: expected hf:ORG/NAME (e.g. hf:HuggingFaceH4/ultrachat_200k)")
    split, config, revision = params.get("split", "train"), params.get("config"), params.get("revision")
    try:  # 1. the hub download cache: no network needed
        local = snapshot_download(name, repo_type="dataset", revision=revision, local_files_only=True,
                                  cache_dir=hub_cache_dir())
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        local = None
    if local is not None:
        return datasets.load_dataset(local, config, split=split)
    if offline():
        where = hub_cache_dir() or "the default Hugging Face cache (~/.cache/huggingface/hub)"
        raise FileNotFoundError(
            f"data.path {path!r}: dataset {name}" + (f" (revision {revision})" if revision else "")
            + f" is not in the local cache {where} and the hub is unreachable (offline mode). Fetch it once online: "
            f"`huggingface-cli download --repo-type dataset {name}`, or point data.path at a copied "
            "save_to_disk folder or parquet files")
    try:  # 2. online: datasets downloads and caches it
        return datasets.load_dataset(name, config, split=split, revision=revision)
    except (ConnectionError, OSError) as exc:
        raise FileNotFoundError(f"data.path {path!r}: cannot fetch {name} from the hub and it is not cached ({exc}); "
                                "check the name and network, or set HF_HUB_OFFLINE=1 and use a cached copy") from exc


def load(path: str):
    """data.path entry -> a datasets.Dataset (one split)."""
    import datasets

    if is_hf(path):
        return _load_hf(path)
    base, params = split_query(path)
    if base.endswith(".parquet"):
        return datasets.Dataset.from_parquet(base)
    if base.endswith(".arrow"):
        return datasets.Dataset.from_file(base)
    loaded = datasets.load_from_disk(base)
    if isinstance(loaded, datasets.DatasetDict):
        split = params.get("split", "train")
        if split not in loaded:
            raise UserError(f"data.path {path!r}: the saved DatasetDict has splits {list(loaded)}, not {split!r}; "
                             f"add ?split=NAME")
        return loaded[split]
    return loaded


def label(path: str) -> str:
    """How rows of this source are named in the data report."""
    if is_hf(path):
        base, params = split_query(path)
        return f"{base}[{params.get('split', 'train')}]"
    base = split_query(path)[0]
    return Path(base).name or base


def raw_rows(path: str) -> Iterator[tuple[str, int, dict]]:
    """(source label, index, row dict) per dataset row; formats.iter_rows makes each a RawRow named
    SOURCE:INDEX (this module does not import formats: formats imports it)."""
    ds = load(path)
    name = label(path)
    for i, row in enumerate(ds):
        yield name, i, dict(row)


def fingerprint(path: str) -> str:
    """A stable id of this source's content (datasets' own fingerprint of the loaded split)."""
    return load(path)._fingerprint
