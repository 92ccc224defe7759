"""Data for drafter training: conversation formats and loss masks (formats, chat), token
datasets and batching (dataset), the reduced draft vocabulary (draft_vocab), regeneration of
answers with the target (regenerate) and the offline feature cache (feature_cache).
docs/data.md describes the accepted formats and the plain chat format."""
from draftsmith.data import draft_vocab
from draftsmith.data.dataset import (
    BatchStream,
    DataReport,
    TokenDataset,
    build_dataset,
    collate,
    token_counts,
    training_data_config,
)

__all__ = ["BatchStream", "DataReport", "TokenDataset", "build_dataset", "collate", "draft_vocab", "token_counts",
           "training_data_config"]
