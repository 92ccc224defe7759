"""Issue 34 (trust, round 4): a password inside regenerate.endpoint (user:pass@host) is never printed or
stored: the recipe is refused naming the key, with the password replaced by ***."""
from __future__ import annotations

import pytest
import yaml

from draftsmith import cli
from draftsmith.core.urls import has_userinfo, redacted


@pytest.mark.parametrize("url, shown", [
    ("http://user:hunter2@10.0.0.5:8000/v1", "http://***@10.0.0.5:8000/v1"),
    ("https://tok@api.example/v1?x=1", "https://***@api.example/v1?x=1"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
])
def test_redacted_hides_what_comes_before_the_host(url, shown):
    assert redacted(url) == shown
    assert has_userinfo(url) == (url != shown)


@pytest.mark.parametrize("command", ["validate", "prepare"])
def test_a_recipe_endpoint_with_a_password_is_refused_without_echoing_it(tmp_path, capsys, command):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hello"}\n')
    out = tmp_path / "out.jsonl"
    recipe = tmp_path / "shared.yaml"
    recipe.write_text(yaml.safe_dump({"data": {"path": [str(data)]}, "regenerate": {
        "generator": "openai", "endpoint": "http://user:hunter2@127.0.0.1:9/v1", "output": str(out)}}))
    rc = cli.main([command, str(recipe)])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert rc in (1, 2) and "regenerate.endpoint" in text and "http://***@127.0.0.1:9/v1" in text
    assert "hunter2" not in text
    assert not out.exists()
