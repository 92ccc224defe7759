"""Robustness harness, issue 34 (trust, round 4): the classes it found, generated over every command
they reach. Special files (a copy of /dev/null's device node, a FIFO, a socket, links to /dev/zero
or a FIFO) in place of a user-named output or a received file; declared sizes past the real tensors;
batch sizes; recipes past their bounds. The sandbox also asserts that no device node, FIFO or socket
is ever replaced, even when it is the command's own output.

Generated inputs in CI: 5 per output (eval, profile, report, leaderboard, prepare), 5 per received file
(drafter.json, config.yaml, speedup_profile.json through eval; a result through report and leaderboard;
a recipe through validate), plus the fixed cases below."""
from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.robustness import strategies as S
from tests.robustness import world
from tests.robustness.conftest import harness_settings
from tests.robustness.sandbox import Case

CKPT = world.CHECKPOINT
EVAL = ["eval", CKPT, *world.EVAL_FAST]
KINDS = st.sampled_from(S.SPECIAL_KINDS)
QUICK = 20  # seconds: a refusal comes before anything loads; a FIFO read or write would hang until killed


@harness_settings(5)
@given(kind=KINDS)
def test_eval_out_special_file(check, kind):
    out = check(Case([*EVAL, "--out", "out/r.json"], names=["--out"], outputs=["out"], seconds=QUICK,
                     expect_error=True), [S.special_file("out/r.json", kind, ["--out"])])
    assert out.code == 2


@harness_settings(5)
@given(kind=KINDS)
def test_profile_out_special_file(check, kind):
    argv = ["profile", CKPT, "--workloads", f"jsonl:{world.PROMPTS}", "--contexts", "16", "--out", "prof/p.json"]
    check(Case(argv, names=["--out"], outputs=["prof"], seconds=QUICK, expect_error=True),
          [S.special_file("prof/p.json", kind, ["--out"])])


@harness_settings(5)
@given(kind=KINDS)
def test_report_html_special_file(check, kind):
    check(Case(["report", world.RESULT, "--html", "page/r.html"], names=["--html"], outputs=["page"], seconds=QUICK,
               expect_error=True, no_control=True), [S.special_file("page/r.html", kind, ["--html"])])


@harness_settings(5)
@given(kind=KINDS, name=st.sampled_from(["index.html", "README.md", "rows.json"]))
def test_leaderboard_out_files_special(check, kind, name):
    check(Case(["leaderboard", "results", "--out", "lb"], names=["--out"], outputs=["lb"], seconds=QUICK,
               expect_error=True), [S.special_file(f"lb/{name}", kind, ["--out"])])


@harness_settings(5)
@given(kind=KINDS, which=st.sampled_from(["regen.jsonl", "regen.jsonl.summary.json"]))
def test_prepare_regenerate_output_special(check, kind, which):
    check(Case(["prepare", "recipe.yaml", "regenerate.output=out/regen.jsonl"], names=["regenerate.output"],
               outputs=["out"], seconds=QUICK, expect_error=True), [S.special_file(f"out/{which}", kind)])


@harness_settings(5)
@given(kind=KINDS, name=st.sampled_from(["drafter.json", "config.yaml", "speedup_profile.json", "drafter.safetensors"]))
def test_received_checkpoint_files_special(check, kind, name):
    check(Case([*EVAL, "--out", "out/r.json"], names=[name], outputs=["out"], seconds=QUICK, expect_error=True),
          [S.special_file(f"{CKPT}/{name}", kind)])


@harness_settings(5)
@given(kind=KINDS, argv=st.sampled_from([["report", world.RESULT, "--no-html"], ["leaderboard", world.RESULT, "--out", "lb"]]))
def test_received_result_special(check, kind, argv):
    check(Case(argv, names=["base.json"], outputs=["lb"], seconds=QUICK, expect_error=True, no_control=True),
          [S.special_file(world.RESULT, kind)])


@harness_settings(5)
@given(kind=KINDS)
def test_recipe_special(check, kind):
    check(Case(["validate", "recipe.yaml"], names=["recipe.yaml"], named_at=(1, 2), seconds=QUICK, expect_error=True),
          [S.special_file("recipe.yaml", kind)])


# --------------------------------------------------------------------------- declared sizes and bounds

def _declare_layers(n):
    def apply(root):
        path = root / "target" / "config.json"
        cfg = json.loads(path.read_text())
        cfg["num_hidden_layers"] = n
        path.write_text(json.dumps(cfg))
    return apply


@harness_settings(4)
@given(n=st.sampled_from([5, 64, 100_000, 10**9]))
def test_declared_layers_past_the_tensors(check, n):
    damage = S.Damage(f"target/config.json: num_hidden_layers = {n}", _declare_layers(n), ["num_hidden_layers"])
    check(Case(["inspect", "target"], names=["num_hidden_layers"], named_at=(1, 2), seconds=QUICK, expect_error=True),
          [damage])
    check(Case([*EVAL, "--out", "out/r.json"], names=["num_hidden_layers"], outputs=["out"], seconds=QUICK,
               expect_error=True), [damage])


@harness_settings(4)
@given(flag=st.sampled_from(["--batches", "--validate-batches", "--overhead-batch"]),
       value=st.sampled_from(["1025", "1000000000", "2,99999999"]))
def test_profile_batch_sizes_bounded(check, flag, value):
    argv = ["profile", CKPT, "--workloads", f"jsonl:{world.PROMPTS}", "--contexts", "16", flag, value,
            "--out", "prof/p.json"]
    check(Case(argv, names=[flag], outputs=["prof"], seconds=QUICK, expect_error=True))


def _recipe(kind):
    def apply(root):
        data = yaml.safe_load((root / "recipe.yaml").read_text())
        if kind == "big_scalar":
            data["name"] = "x" * (2 << 20)
        elif kind == "many_keys":
            data["train"] = {**data.get("train", {}), **{f"k{i}": i for i in range(3000)}}
        elif kind == "long_key":
            data["train"] = {**data.get("train", {}), "k" * 50_000: 1}
        else:
            data["drafter"]["options"] = {"int": 5, "list": [1, 2], "str": "x"}[kind.split("_")[1]]
        (root / "recipe.yaml").write_text(yaml.safe_dump(data, width=10**9))
    return apply


@harness_settings(6)
@given(kind=st.sampled_from(["big_scalar", "many_keys", "long_key", "options_int", "options_list", "options_str"]))
def test_recipes_past_their_bounds(check, kind):
    damage = S.Damage(f"recipe.yaml: {kind}", _recipe(kind), ["recipe.yaml"])
    out = check(Case(["validate", "recipe.yaml"], names=["recipe.yaml"], named_at=(1, 2), seconds=QUICK,
                     expect_error=True), [damage])
    assert len(out.stdout) < 20_000


# --------------------------------------------------------------------------- export's copy of the speedup profile

EXPORT = ["export", CKPT, "--to", "vllm", "--out", "exp"]


@harness_settings(5)
@given(kind=KINDS)
def test_export_received_profile_special(check, kind):
    """export reads the checkpoint's speedup_profile.json itself (to copy it on): bounded, regular files only."""
    check(Case(EXPORT, names=["speedup_profile.json"], outputs=["exp"], seconds=QUICK, expect_error=True),
          [S.special_file(f"{CKPT}/speedup_profile.json", kind)])


def _profile(kind):
    def apply(root):
        text = json.dumps({"schema": "draftsmith.speedup-profile", "recommendation": [1]} if kind == "list_rec"
                          else {"schema": "draftsmith.speedup-profile", "recommendation": {"w": 5}})
        path = root / CKPT / "speedup_profile.json"
        path.write_bytes(text.encode("utf-16") if kind == "utf16" else text.encode())
    return apply


@harness_settings(3)
@given(kind=st.sampled_from(["utf16", "list_rec", "int_rec"]))
def test_export_damaged_profile(check, kind):
    damage = S.Damage(f"speedup_profile.json: {kind}", _profile(kind), ["speedup_profile.json"])
    check(Case(EXPORT, names=["speedup_profile.json"], outputs=["exp"], seconds=QUICK, expect_error=True), [damage])


@pytest.mark.parametrize("kind", ["fifo", "link_to_dev_zero"])
def test_export_received_weights_special(check, kind):
    """Issue 44 item 17: a FIFO drafter.safetensors hung export as it hung eval (the eval side is above)."""
    check(Case(EXPORT, names=["drafter.safetensors"], outputs=["exp"], seconds=QUICK, expect_error=True),
          [S.special_file(f"{CKPT}/drafter.safetensors", kind)])
