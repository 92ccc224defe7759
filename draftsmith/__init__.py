"""draftsmith: train, evaluate and export drafters for speculative decoding."""

__version__ = "0.1.0"
