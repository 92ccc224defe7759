"""Loading a target: transformers checkpoints, GGUF files, installed models, architectures."""
