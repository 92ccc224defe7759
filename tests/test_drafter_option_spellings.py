"""A drafter option has two spellings, `drafter.ttt_steps` (beside kind) and `drafter.options.ttt_steps`
(issue 44 item 9): `drafter.options.ttt_steps=2` was silently overwritten by the recipe's flat
`ttt_steps: 5` (`--print-config` said 5 and training used 5). Overrides now write one setting whatever
the spelling (the last wins); a recipe that writes one option both ways with two values is refused."""
from __future__ import annotations

import pytest
import yaml

from draftsmith import cli, config
from draftsmith.core.errors import ConfigError

FLAT = {"target": {"path": "builtin:pycode-tiny"}, "drafter": {"kind": "eagle3", "ttt_steps": 5}}


@pytest.mark.parametrize("overrides, want", [(["drafter.options.ttt_steps=2"], 2), (["drafter.ttt_steps=3"], 3),
                                             (["drafter.options.ttt_steps=2", "drafter.ttt_steps=4"], 4),
                                             (["drafter.ttt_steps=4", "drafter.options.ttt_steps=2"], 2)])
def test_an_override_wins_whatever_its_spelling(overrides, want):
    assert config.from_dict(FLAT, overrides=overrides).drafter.options.ttt_steps == want


def test_print_config_shows_the_overridden_value(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(FLAT))
    assert cli.main(["train", str(path), "drafter.options.ttt_steps=2", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["drafter"]["options"]["ttt_steps"] == 2


def test_a_recipe_writing_one_option_twice_with_two_values_is_refused():
    both = {"drafter": {"kind": "eagle3", "ttt_steps": 5, "options": {"ttt_steps": 2}}}
    with pytest.raises(ConfigError, match="drafter.ttt_steps is 5 but drafter.options.ttt_steps is 2: write the option once"):
        config.from_dict(both)
    same = {"drafter": {"kind": "eagle3", "ttt_steps": 2, "options": {"ttt_steps": 2}}}
    assert config.from_dict(same).drafter.options.ttt_steps == 2


def test_a_saved_config_takes_a_flat_override():
    """A checkpoint's config.yaml holds drafter.options; a flat override of it is not a conflict."""
    saved = config.to_dict(config.from_dict(FLAT))
    assert config.from_dict(saved, overrides=["drafter.ttt_steps=3"]).drafter.options.ttt_steps == 3
