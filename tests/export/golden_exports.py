"""Every kind x every in-process format exported from the same seeded tiny checkpoints, reduced to what must not
change when export's code is reorganised: each written file's SHA-256 (paths of the run replaced by <TMP>, the
draftsmith version and the write time dropped from draftsmith.json) and doctor's verdict on the export's own serve
command. tests/export/test_golden_exports.py compares the code against golden_exports.json; run this module to
write that file again after a change that is meant to alter exports:

    python tests/export/golden_exports.py tests/export/golden_exports.json
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VOLATILE = ("draftsmith_version", "written_at_ns", "exported_at")


def _normalised(path: Path, tmp: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix not in (".json", ".yaml", ".txt", ".md", ".sh") and path.name != "README":
        return data
    text = data.decode("utf-8").replace(str(tmp), "<TMP>")
    if path.name == "draftsmith.json":
        side = json.loads(text)

        def drop(node):
            if isinstance(node, dict):
                return {k: drop(v) for k, v in node.items() if k not in VOLATILE}
            if isinstance(node, list):
                return [drop(v) for v in node]
            return node

        text = json.dumps(drop(side), sort_keys=True)
    return re.sub(r"\.tmp-\d+-\w+", ".tmp-X", text).encode()


def _doctor(export_dir: Path, serve_command: str, version: str | None) -> list[str]:
    try:
        from draftsmith.export.doctor.run import diagnose
    except ImportError:  # the layout before export/ had one folder per engine
        from draftsmith.export.doctor import diagnose
    report = diagnose(str(export_dir), serve_command, version)
    return [f"exit {report.exit_code}"] + report.lines()


def collect(tmp: Path) -> dict:
    sys.path.insert(0, str(HERE.parents[1]))  # the repository root, when run as a script
    from draftsmith.export import EXPORTERS, can_export, engine_versions, export, formats_for
    from draftsmith.heads import DRAFTERS
    from tests.export.conftest import make_checkpoint

    try:
        from draftsmith.export.layout import ExportOptions
    except ImportError:  # the layout before export/ had one folder per engine
        from draftsmith.export.common import ExportOptions

    out = {}
    for kind in DRAFTERS.names():
        ckpt = make_checkpoint(tmp / kind, kind, dict(DRAFTERS.get(kind).tiny_options))
        for fmt in formats_for(kind):
            if not EXPORTERS.get(fmt).checked_in_process:
                continue  # llama.cpp: its own round-trip tests run llama-server
            served = [v for v in reversed(engine_versions.versions(fmt) or [None]) if not can_export(kind, fmt, v)]
            if not served:
                continue
            opts = ExportOptions(engine_version=served[0])  # the newest release that serves the kind
            result = export(ckpt, fmt, tmp / f"{kind}-{fmt}", opts, validate=False)
            files = {str(p.relative_to(result.out_dir)): hashlib.sha256(_normalised(p, tmp)).hexdigest()
                     for p in sorted(result.out_dir.rglob("*")) if p.is_file()}
            doctor = [line.replace(str(tmp), "<TMP>") for line in _doctor(result.out_dir, result.serve_command, served[0])]
            out[f"{kind}/{fmt}"] = {"engine_version": served[0], "files": files, "doctor": doctor}
    return out


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        got = collect(Path(tmp))
    Path(argv[0]).write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    print(f"{len(got)} exports -> {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
