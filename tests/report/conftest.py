"""Fixtures for the report tests; the result-file helpers live in result_files.py."""
from __future__ import annotations

from pathlib import Path

import pytest
from result_files import HW_GPU, make_result, workload, write


@pytest.fixture
def three_results(tmp_path: Path) -> list[Path]:
    """Three files: two drafters of one target on two machines, and one on a second target.

    Expected order (target, workload, acceptance length desc):
      stories260K/mt_bench:   eagle3-a (2.0), medusa-b (1.6)
      stories260K/spec_bench: medusa-b (2.8), eagle3-a (2.5)
      tiny-llama/spec_bench:  ngram (1.4)
    """
    a = make_result(drafter="eagle3-a", workloads={
        "spec_bench": workload(2.5, [0.9, 0.6, 0.4], speedup=1.3),
        "mt_bench": workload(2.0, [0.7, 0.5, 0.3], speedup=1.1)})
    b = make_result(drafter="medusa-b", kind="medusa", hardware=HW_GPU, workloads={
        "spec_bench": workload(2.8, [0.95, 0.7, 0.6], speedup=2.5),
        "mt_bench": workload(1.6, [0.5, 0.4, 0.3], speedup=1.9)})
    c = make_result(target="tiny-llama", drafter="ngram", kind="ngram", k=2, workloads={
        "spec_bench": workload(1.4, [0.3, 0.2], speedup=0.9)})
    return [write(tmp_path / "results" / f"{n}.json", d) for n, d in (("a", a), ("b", b), ("c", c))]
