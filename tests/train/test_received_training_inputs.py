"""Issue 34 (trust, round 4), training inputs from others: an init_from export whose draftsmith.json
holds `recipe: "x"`, and a trainer_state.pt whose RNG state is 3 bytes, are one line naming the file."""
from __future__ import annotations

import json

import pytest
import torch

from draftsmith import checkpoint as ckpt_io
from draftsmith.core.errors import UserError
from draftsmith.train import checkpoint
from tests.export.conftest import make_checkpoint


def test_init_from_an_export_whose_recipe_is_a_string_is_one_line(tmp_path):
    from draftsmith.export import export

    ckpt = make_checkpoint(tmp_path / "src", "eagle3", {"ttt_steps": 2})
    loaded = ckpt_io.load_drafter(ckpt, device="cpu")
    out = export(None, "vllm", tmp_path / "v", loaded=loaded, validate=False).out_dir
    sidecar = json.loads((out / "draftsmith.json").read_text())
    sidecar["recipe"] = "x"
    (out / "draftsmith.json").write_text(json.dumps(sidecar))
    with pytest.raises(UserError, match="draftsmith.json's recipe is a JSON str, not the export's recipe mapping"):
        checkpoint.load_init_weights(out, loaded.drafter, loaded.target)


@pytest.mark.parametrize("damage", [
    lambda s: s.update(torch=torch.zeros(3, dtype=torch.uint8)),
    lambda s: s.update(python={"version": 3, "state": torch.zeros(2, dtype=torch.int64), "gauss": None}),
    lambda s: s.pop("numpy"),
])
def test_a_damaged_rng_state_is_one_line_naming_the_file(damage):
    state = checkpoint.rng_state()
    damage(state)
    with pytest.raises(UserError, match="runs/x/trainer_state.pt: its RNG state does not restore"):
        checkpoint.set_rng_state(state, "runs/x/trainer_state.pt")
    checkpoint.set_rng_state(checkpoint.rng_state())  # a whole state restores as before
