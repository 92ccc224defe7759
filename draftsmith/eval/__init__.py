"""Evaluation: the speculative decoding loop, verification rules, proposers, workloads, metrics."""
