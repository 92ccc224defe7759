"""features.label_topk: the offline cache stores the target's top-K logits, and training makes its soft labels
from them instead of replaying the lm_head. With K = V the labels and losses are today's (up to the float16 of
the cached values); with a small K they are the renormalised top-K; the cache records K and refuses another;
training with the option never calls the lm_head replay."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from draftsmith import config
from draftsmith.cli import main as cli_main
from draftsmith.core.errors import ConfigError, UserError
from draftsmith.data import TokenDataset, collate, feature_cache, features
from draftsmith.heads import DRAFTERS, vocab_loss
from draftsmith.targets.load import Target
from draftsmith.testing import tiny_target
from draftsmith.train.loop import train

REQUIRED = {"input_ids", "attention_mask", "loss_mask", "aux_hidden_states", "target_logits"}
QUIET = dict(log=lambda *_: None)


@pytest.fixture(scope="module")
def target():
    return tiny_target(num_layers=4, hidden=32, seed=0)


def _dataset(n=5):
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 250, (6 + 3 * i,), generator=g, dtype=torch.int32) for i in range(n)]
    masks = [torch.tensor([0] + [1] * (len(x) - 1), dtype=torch.uint8) for x in ids]
    return TokenDataset(ids, masks, [f"r{i}" for i in range(n)])


def _eagle3(target, **options):
    cls = DRAFTERS.get("eagle3")
    torch.manual_seed(0)
    counts = torch.randint(0, 50, (target.vocab_size,))
    return cls.from_target(cls.Config(ttt_steps=3, draft_vocab_size=100, **options), target, counts)


def _build(target, root, k, layers):
    return feature_cache.build(target, _dataset(), str(root), layers, "float32", shard_rows=2, required=REQUIRED,
                               batch_size=2, label_topk=k, **QUIET)


def _batches(target, root, k, layers, rows=(1, 3, 4)):
    """The same rows as the dense path completes them (lm_head replay) and as the top-K path does."""
    dense = feature_cache.open(str(root), target, layers, REQUIRED)
    top = feature_cache.open(str(root), target, layers, REQUIRED, label_topk=k)
    a = features.complete(target, collate([dense[i] for i in rows], 0), REQUIRED, layers)
    b = features.complete(target, collate([top[i] for i in rows], 0), REQUIRED, layers)
    return a, b


def test_k_equal_to_the_vocabulary_gives_todays_labels_and_losses(tmp_path, target):
    v = target.vocab_size
    drafter = _eagle3(target)
    layers = drafter.feature_layers()
    _build(target, tmp_path, v, layers)
    dense, top = _batches(target, tmp_path, v, layers)
    assert torch.is_tensor(dense["target_logits"]) and isinstance(top["target_logits"], features.TopKLogits)
    real = dense["attention_mask"].bool()
    ids = drafter.draft_ids()
    for temperature in (1.0, 2.0, 0.5):
        p_dense, top_dense = vocab_loss.soft_labels(dense["target_logits"], ids, temperature=temperature)
        p_top, top_top = vocab_loss.soft_labels(top["target_logits"], ids, temperature=temperature)
        torch.testing.assert_close(p_top[real], p_dense[real], atol=2e-4, rtol=2e-3)
        assert torch.equal(top_top[real], top_dense[real])
    positions = torch.tensor([[0, 2, 2, 5], [1, 1, 3, 0], [4, 0, 7, 6]])
    for got, want in zip(vocab_loss.gathered_soft_labels(top["target_logits"], positions, ids),
                         vocab_loss.gathered_soft_labels(dense["target_logits"], positions, ids)):
        torch.testing.assert_close(got.float(), want.float(), atol=2e-4, rtol=2e-3)
    for kind_options in ({}, {"hard_label_weight": 0.0, "label_temperature": 2.0}):
        d = _eagle3(target, **kind_options).eval()
        with torch.no_grad():
            want, got = d.forward_loss(dense), d.forward_loss(top)
        assert float(got.loss) == pytest.approx(float(want.loss), rel=1e-3)
        assert got.num_tokens == want.num_tokens and got.metrics == pytest.approx(want.metrics, rel=1e-3)


@pytest.mark.parametrize("kind", ["dflash", "peagle"])
def test_block_kinds_take_the_same_labels(tmp_path, target, kind):
    cls = DRAFTERS.get(kind)
    cfg = cls.Config(**cls.tiny_options)
    torch.manual_seed(0)
    d = cls.from_target(cfg, target, torch.randint(0, 50, (target.vocab_size,))).eval()  # eval: the same blocks
    layers = d.feature_layers()
    _build(target, tmp_path, target.vocab_size, layers)
    dense, top = _batches(target, tmp_path, target.vocab_size, layers)
    with torch.no_grad():
        want, got = d.forward_loss(dense), d.forward_loss(top)
    assert float(want.loss) > 0
    assert float(got.loss) == pytest.approx(float(want.loss), rel=1e-3)


def test_small_k_labels_are_the_renormalised_top_k(tmp_path, target):
    drafter = _eagle3(target)
    layers, ids = drafter.feature_layers(), drafter.draft_ids()
    k = 5
    _build(target, tmp_path, k, layers)
    dense, top = _batches(target, tmp_path, k, layers)
    logits = dense["target_logits"].float()  # [b, s, V] the replayed full logits
    values, best = logits.topk(k, dim=-1)
    real = dense["attention_mask"].bool()
    assert torch.equal(top["target_logits"].ids[real], best[real])
    p, argmax = vocab_loss.soft_labels(top["target_logits"], ids, temperature=1.5)
    assert torch.equal(argmax[real], logits.argmax(-1)[real])
    in_draft = torch.zeros(target.vocab_size, dtype=torch.bool)
    in_draft[ids] = True
    want = torch.zeros_like(p)
    for b, s in real.nonzero().tolist():
        keep = in_draft[best[b, s]]
        if keep.any():
            w = torch.softmax(values[b, s][keep] / 1.5, -1)
            want[b, s, (ids[:, None] == best[b, s][keep][None]).int().argmax(0)] = w
    torch.testing.assert_close(p[real], want[real], atol=1e-3, rtol=1e-3)
    assert int((p[real] > 0).sum(-1).max()) <= k
    sums = p[real].sum(-1)
    assert torch.all(((sums - 1).abs() < 1e-5) | (sums == 0))  # a distribution, or nothing to teach


def test_no_top_k_entry_in_the_draft_vocabulary_teaches_nothing():
    draft_ids = torch.tensor([2, 5, 7])
    top = features.TopKLogits(ids=torch.tensor([[[5, 1, 7], [0, 1, 3]]]),
                              values=torch.tensor([[[0.0, -1.0, -2.0], [0.0, -0.5, -1.0]]], dtype=torch.float16),
                              vocab_size=9)
    p, argmax = vocab_loss.soft_labels(top, draft_ids)
    e = torch.exp(torch.tensor([0.0, -2.0]))
    torch.testing.assert_close(p[0, 0], torch.tensor([0.0, float(e[0] / e.sum()), float(e[1] / e.sum())]))
    assert torch.equal(p[0, 1], torch.zeros(3)) and argmax.tolist() == [[5, 0]]


def test_cache_records_k_and_refuses_another(tmp_path, target):
    layers = _eagle3(target).feature_layers()
    plain, topk = tmp_path / "plain", tmp_path / "topk"
    m = _build(target, plain, None, layers)
    assert m["format_version"] == 2 and "label_topk" not in m  # without the option: the cache as before
    m = _build(target, topk, 5, layers)
    assert m["format_version"] == 3 and m["label_topk"] == 5
    with safe_open(str(topk / m["shards"][0]["file"]), "pt") as f:
        assert f.get_tensor("0/label_topk_ids").dtype == torch.int32
        assert f.get_tensor("0/label_topk_values").dtype == torch.float16
        assert f.get_tensor("0/label_topk_values").shape == (6, 5)
    for root, k, held in ((plain, 5, "holds no top-K logits"), (topk, 7, "holds top-5 logits")):
        with pytest.raises(UserError) as exc:
            feature_cache.open(str(root), target, layers, REQUIRED, label_topk=k)
        text = str(exc.value)
        assert "\n" not in text and held in text and f"features.label_topk is {k}" in text
        assert "draftsmith prepare recipe.yaml --features" in text
    for root, k in ((plain, 5), (topk, 7), (topk, None)):  # prepare (resume) refuses a cache of another K
        with pytest.raises(UserError, match="label_topk.*draftsmith prepare recipe.yaml --features") as exc:
            _build(target, root, k, layers)
        assert "\n" not in str(exc.value)
    assert len(feature_cache.open(str(topk), target, layers, REQUIRED)) == 5  # label_topk null: replays as before
    with pytest.raises(UserError, match="must lie in \\[1, 259\\]"):
        _build(target, tmp_path / "big", 260, layers)


def _edit(root, change):
    path = root / "manifest.json"
    m = json.loads(path.read_text())
    change(m)
    path.write_text(json.dumps(m))


@pytest.mark.parametrize("change,needle", [
    (lambda m: m.pop("label_topk"), "label_topk is 'None'"),
    (lambda m: m.update(label_topk=0), "label_topk is '0'"),
    (lambda m: m.update(label_topk="5"), "label_topk is '5'"),
    (lambda m: m.update(format_version=2), "label_topk is set in a format_version 2 manifest"),
    (lambda m: m.update(format_version=4), "format_version is '4'"),
])
def test_top_k_manifest_keys_are_typed(tmp_path, target, change, needle):
    layers = _eagle3(target).feature_layers()
    _build(target, tmp_path, 5, layers)
    _edit(tmp_path, change)
    with pytest.raises(UserError, match="manifest.json") as exc:
        feature_cache.open(str(tmp_path), target, layers, REQUIRED, label_topk=5)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_damaged_top_k_tensors_are_refused_in_one_line(tmp_path, target):
    layers = _eagle3(target).feature_layers()
    m = _build(target, tmp_path, 5, layers)
    shard = tmp_path / m["shards"][0]["file"]
    with safe_open(str(shard), "pt") as f:
        tensors, meta = {key: f.get_tensor(key) for key in f.keys()}, f.metadata()
    bad = dict(tensors)
    bad["1/label_topk_ids"] = bad["1/label_topk_ids"].clone()
    bad["1/label_topk_ids"][2, 1] = target.vocab_size  # outside the vocabulary, same size
    save_file(bad, str(shard), metadata=meta)
    rows = feature_cache.open(str(tmp_path), target, layers, REQUIRED, label_topk=5)
    rows[0]
    with pytest.raises(UserError, match=r"shard_00000.safetensors: row 1's top-K logits hold an id outside") as exc:
        rows[1]
    assert "\n" not in str(exc.value)
    bad = dict(tensors)
    bad["0/label_topk_values"] = bad["0/label_topk_values"][:, :4].contiguous()  # another K: the header check
    save_file(bad, str(shard), metadata=meta)
    _edit(tmp_path, lambda m: m["shards"][0].update(size=shard.stat().st_size))
    with pytest.raises(UserError, match="label_topk_values.*F16 of shape \\[6, 5\\]"):
        feature_cache.open(str(tmp_path), target, layers, REQUIRED, label_topk=5)[0]


def test_predicted_size_counts_the_top_k(tmp_path):
    base = feature_cache.predict_bytes(1000, 10, ["aux_hidden_states", "last_hidden_state"], 3, 576, "int8")
    top = feature_cache.predict_bytes(1000, 10, ["aux_hidden_states", "last_hidden_state"], 3, 576, "int8", 20)
    assert top["per_token"] - base["per_token"] == 20 * (4 + 2)
    assert top["total"] - base["total"] == 1000 * 120 + 100 * 10 * 2


def _count_replays(monkeypatch) -> list:
    calls = []
    real = Target.logits_from_hidden

    def counted(self, hidden):
        calls.append(hidden.shape)
        return real(self, hidden)

    monkeypatch.setattr(Target, "logits_from_hidden", counted)
    return calls


def test_training_with_label_topk_never_replays_the_lm_head(tiny_run, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    common = ["features.mode=offline", f"features.cache_dir={cache}", "features.dtype=float32", "train.max_steps=4",
              "train.eval_every=2"]
    recipe = tmp_path / "topk.yaml"
    recipe.write_text(config.to_yaml(tiny_run("prep", *common, "features.label_topk=259")))
    assert cli_main(["prepare", str(recipe), "--features"]) == 0
    calls = _count_replays(monkeypatch)
    dense = train(tiny_run("dense", *common))  # the same cache, label_topk null: the lm_head replay, as before
    assert len(calls) > 0
    calls.clear()
    top = train(tiny_run("topk", *common, "features.label_topk=259"))
    assert calls == []  # neither the training steps nor the held-out evaluation replayed the lm_head
    assert top.losses == pytest.approx(dense.losses, rel=2e-3)


def test_label_topk_refusals(tiny_run):
    offline = ["features.mode=offline", "features.cache_dir=x", "features.label_topk=20"]
    with pytest.raises(ConfigError, match="features.label_topk: 20 reads the top-K logits"):
        tiny_run("a", "features.label_topk=20")  # online features: nothing is cached
    with pytest.raises(ConfigError, match="drafter kind medusa reads the target's full logits"):
        tiny_run("b", *offline, "drafter={kind: medusa}")
    with pytest.raises(ConfigError, match="features.label_topk: must lie in"):
        tiny_run("c", *offline[:2], "features.label_topk=0")
    assert tiny_run("d", *offline).features.label_topk == 20
    full_logits = [k for k in DRAFTERS.names() if not DRAFTERS.get(k).takes_topk_labels]
    assert set(full_logits) >= {"medusa", "eagle1", "mlp_speculator", "draft_lm"} and "eagle3" not in full_logits


def test_several_builders_write_the_same_top_k(tmp_path, target):
    """prepare --nproc / torchrun builders share build(): ranks of world 2 leave the cache one builder writes."""
    layers = _eagle3(target).feature_layers()
    one = _build(target, tmp_path / "one", 5, layers)
    for rank in (1, 0):
        m = feature_cache.build(target, _dataset(), str(tmp_path / "two"), layers, "float32", shard_rows=2,
                                required=REQUIRED, batch_size=2, label_topk=5, rank=rank, world=2, **QUIET)
    assert m["complete"] and m["label_topk"] == 5 and m["format_version"] == 3
    a = feature_cache.open(str(tmp_path / "one"), target, layers, REQUIRED, label_topk=5)
    b = feature_cache.open(str(tmp_path / "two"), target, layers, REQUIRED, label_topk=5)
    for i in range(one["rows"]):
        for key in features.TOPK_FEATURES:
            assert torch.equal(a[i][key], b[i][key])
