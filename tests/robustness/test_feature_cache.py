"""Robustness harness, issue 44 item 2: a received feature cache (manifest.json and its shards) damaged,
through `train features.mode=offline` (which must refuse in one line naming the file) and
`prepare --features` (which must refuse in one line or rebuild the damaged shard).

Issue 43: a received folder of vLLM hidden-states files damaged, through `train features.source=vllm`.

Generated inputs in CI: 10 damages through train, 8 through prepare, 12 vLLM-folder damages (tests/robustness/strategies.py:
feature_cache_damage: manifest values, whole manifests, manifest bytes, special files for the manifest or a
shard, shard bytes, another shard's bytes, a shard range past the rows, a shard file outside the cache)."""
from __future__ import annotations

from hypothesis import given

from tests.robustness import strategies as S
from tests.robustness import world
from tests.robustness.conftest import harness_settings
from tests.robustness.sandbox import Case

CACHE = world.CACHE
TRAIN = ["train", "recipe.yaml", "features.mode=offline", f"features.cache_dir={CACHE}", "train.output_dir=runs/off",
         "train.max_steps=1"]
PREPARE = ["prepare", "recipe.yaml", f"features.cache_dir={CACHE}", "features.shard_rows=8", "--features"]


@harness_settings(10)
@given(damage=S.feature_cache_damage(CACHE))
def test_train_from_a_damaged_feature_cache(check, damage):
    check(Case(TRAIN, names=damage.names, outputs=["runs/off"], seconds=120, label=damage.label), [damage])


@harness_settings(8)
@given(damage=S.feature_cache_damage(CACHE))
def test_prepare_over_a_damaged_feature_cache(check, damage):
    out = check(Case(PREPARE, names=damage.names, outputs=[CACHE], seconds=120, label=damage.label), [damage])
    assert out.code in (0, 2)


TRAIN_VLLM = ["train", "recipe.yaml", "features.mode=offline", "features.source=vllm", f"features.dir={world.VLLM_DIR}",
              "train.output_dir=runs/vllm", "train.max_steps=1"]


@harness_settings(12)
@given(damage=S.vllm_folder_damage(world.VLLM_DIR, rows=24))
def test_train_from_a_damaged_vllm_folder(check, damage):
    check(Case(TRAIN_VLLM, names=damage.names, outputs=["runs/vllm"], seconds=120, label=damage.label), [damage])
