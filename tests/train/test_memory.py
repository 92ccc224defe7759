"""PeakMemory on CPU: counts new storages, subtracts freed ones, ignores views of older tensors."""
import torch

from draftsmith.train.memory import PeakMemory


def test_peak_counts_live_storages_only():
    before = torch.zeros(10_000)
    with PeakMemory() as mem:
        x = torch.zeros(1000)  # 4,000 bytes
        del x
        y = torch.ones(2000)  # 8,000 bytes, after x was freed
        view = before[:5000]  # a view: nothing new
        view.add_(1.0)  # in place: nothing new
        z = y * 2  # 8,000 more while y lives
    assert mem.peak == 16_000
    assert z.sum() == 4000
