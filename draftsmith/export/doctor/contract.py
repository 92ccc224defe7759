"""What an export was trained and written for, read back from its directory (draftsmith.json, config.json), and
one finding of `draftsmith doctor`: a field where a serve command departs from it.

The k rule is the export layout's own (`Layout.check_k`, the check `draftsmith export` ran), asked with the
drafter options the sidecar's recipe records: one whole block for a block drafter in vLLM, SGLang and llama.cpp,
at most the trained heads / stages / depths for Medusa, the MLP speculator and P-EAGLE.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.config import typed_drafter_options
from draftsmith.core.bounds import MAX_DRAFT_TOKENS, check_draft_tokens
from draftsmith.core.errors import UserError
from draftsmith.core.files import read_json_object
from draftsmith.export.layout import CONFIG_FILE, EXPORTERS, SIDECAR_FILE, layouts
from draftsmith.heads import DRAFTERS


@dataclass(frozen=True)
class Finding:
    """One field of a serve command against the export: what the engine will do, what the drafter was trained
    for, the corrected flag. changes_acceptance False: a note (printed, exit code unchanged)."""

    field: str
    engine_does: str
    trained_for: str
    fix: str
    changes_acceptance: bool = True

    def line(self, engine: str) -> str:
        tag = "mismatch" if self.changes_acceptance else "note"
        return (f"{tag} {self.field}: {engine} will {self.engine_does}; the drafter was trained for "
                f"{self.trained_for}; fix: {self.fix}")


@dataclass
class Contract:
    export_dir: Path
    sidecar: dict
    config: dict = field(default_factory=dict)  # config.json ({} where the format writes none: llama.cpp)

    @property
    def fmt(self) -> str:
        return str(self.sidecar["format"])

    @property
    def kind(self) -> str:
        return str(self.sidecar["drafter_kind"])

    @property
    def k(self) -> int | None:
        k = self.sidecar.get("num_speculative_tokens")
        return k if isinstance(k, int) and not isinstance(k, bool) else None

    @property
    def serve_command(self) -> str:
        return str(self.sidecar["serve_command"])

    @property
    def options(self) -> dict:
        """The drafter options of the recipe the export records ({} when it records none)."""
        recipe = self.sidecar.get("recipe")
        drafter = recipe.get("drafter") if isinstance(recipe, dict) else None
        options = drafter.get("options") if isinstance(drafter, dict) else None
        return options if isinstance(options, dict) else {}

    @property
    def drafter_config(self):
        """The kind's Config (heads/<kind>.py) typed from the options the export records, as a recipe's
        drafter section is (config.typed_drafter_options); None when it records none or the kind no longer
        reads them."""
        if not self.options:
            return None
        typed, problems, _ = typed_drafter_options(self.kind, dict(self.options))
        return None if problems else typed

    @property
    def verifier(self) -> dict:
        v = self.sidecar.get("verifier")
        return v if isinstance(v, dict) else {}

    @property
    def dtype(self) -> str | None:
        value = self.config.get("torch_dtype") or self.config.get("dtype")
        return value if isinstance(value, str) else None

    def file(self, key: str) -> Path | None:
        """A file the sidecar names (llama.cpp's `draft`, `target`), relative to the export directory."""
        name = self.sidecar.get(key)
        return (self.export_dir / name).resolve() if isinstance(name, str) and name else None

    def block_size(self) -> int | None:
        size = self.options.get("block_size")
        return size if isinstance(size, int) and DRAFTERS.get(self.kind).drafts_block else None

    def k_problem(self, k: int) -> bool:
        """Whether `k` draft tokens a round is refused: by the bound `draftsmith export` applies to every format
        (core/bounds.check_draft_tokens: a whole number in 1..64; `true` is not 1), then by the layout's k rule."""
        try:
            k = check_draft_tokens(k, "k")
        except UserError:
            return True
        layout = layouts(self.fmt).get(self.kind)(self.fmt, EXPORTERS.get(self.fmt).engine, self.kind)
        check = getattr(layout, "check_k", None)
        if self.options and check is None:
            return False
        typed = self.drafter_config
        if typed is None:  # no recipe recorded, or one the kind no longer reads: a block drafter takes its block
            return bool(DRAFTERS.get(self.kind).drafts_block and self.k is not None and k != self.k)
        try:
            check(typed, k)
        except UserError:
            return True
        return False

    def k_does(self, k) -> str:
        """What an engine does with a k that k_problem refuses, in words (`true` is no number of tokens)."""
        if isinstance(k, bool) or not isinstance(k, int):
            return f"refuse or misread k {str(k)[:40]!r} (not a whole number of draft tokens)"
        if k > MAX_DRAFT_TOKENS:
            return (f"draft {k} tokens a round, past the {MAX_DRAFT_TOKENS} `draftsmith export` allows (no engine "
                    "verifies more, and no draft token is accepted that far)")
        return f"draft {k} tokens a round"

    def trained_k(self) -> str:
        """The k the drafter was trained and exported for, in words."""
        block = self.block_size()
        if block is not None:
            return f"blocks of {block} ({self.k} draft tokens a round)"
        return f"{self.k} draft tokens a round (the export's k)"


def read_contract(export_dir) -> Contract:
    """The export in `export_dir` (a `draftsmith export` output); one UserError line when it is not one."""
    directory = Path(export_dir)
    if not directory.is_dir():
        raise UserError(f"{directory}: not a directory; pass the --out directory of `draftsmith export`")
    side_path = directory / SIDECAR_FILE
    if not side_path.exists():
        raise UserError(f"{directory}: no {SIDECAR_FILE}; pass the --out directory of `draftsmith export`")
    side = read_json_object(side_path, "export's draftsmith.json")
    for key in ("format", "drafter_kind", "serve_command"):
        if not isinstance(side.get(key), str) or not side[key]:
            raise UserError(f"{side_path}: no {key}; the file is damaged or from another tool: export again")
    if side["format"] not in EXPORTERS or side["drafter_kind"] not in DRAFTERS or side["drafter_kind"] not in layouts(side["format"]):
        raise UserError(f"{side_path}: format {side['format'][:40]!r} / kind {side['drafter_kind'][:40]!r} is not one "
                        "this draftsmith exports; export again with this version")
    config_path = directory / CONFIG_FILE
    config = read_json_object(config_path, "export's config.json") if config_path.is_file() else {}
    return Contract(directory.resolve(), side, config)
