"""Which engine release serves which drafter kind: one table, each row naming the engine file (inside that
release's wheel) the fact was read from. `draftsmith export --engine-version V` checks the kind against the
row of V (default: the newest release read), refuses what that release cannot serve in one line that says
why and which release does serve it, and records the version in draftsmith.json. TARGETS (below) narrows that per
target: the model class each release has for a hybrid or vision-language model_type and the kinds it serves, one
table per engine registered by export/<engine>/targets.py.

Read from the wheels vllm-0.9.2, vllm-0.20.0, vllm-0.27.0, vllm-0.33.0 and sglang-0.5.23 (paths below are
inside the package). Facts that decide the rows:
  - vLLM 0.33 has no "medusa" and no "mlp_speculator" in config/speculative.py's SpeculativeMethod, and its
    wheel has no model_executor/models/medusa.py or mlp_speculator.py.
  - Every V1 vLLM (0.20, 0.27, 0.33 here) comments MLPSpeculatorPreTrainedModel out of
    model_executor/models/registry.py ("Temporarily disabled ... once the MLP Speculator is supported in V1").
    vLLM 0.9.2 still registers it and serves it through V0 (spec_decode/mlp_speculator_worker.py); its
    engine/arg_utils.py falls back to V0 for the method unless VLLM_USE_V1=1. vLLM 0.10.0 removed V0
    speculative decoding (vllm-project/vllm#21152), so 0.9.2 is the last release that serves it.
  - Medusa: model_executor/models/medusa.py reads the same names and fields in 0.9.2, 0.20 and 0.27
    (0.27 only adds a remap of FasterDecoding's old key names).
  - The speculators formats (EAGLE-3, DFlash, DSpark, P-EAGLE) are read by
    transformers_utils/configs/speculators/algos.py: 0.20 registers eagle3 and dflash; 0.27 and 0.33 add
    peagle and dspark; 0.9.2 has no speculators reader.
  - EAGLE-1: model_executor/models/llama_eagle.py (EagleLlamaForCausalLM) in every release read.
"""
from __future__ import annotations

from dataclasses import dataclass

from draftsmith.core.errors import UserError


@dataclass(frozen=True)
class Serving:
    """Whether one engine release serves one drafter kind's export, and where that was read."""

    served: bool
    source: str  # the engine file(s) the fact was read from, inside that release's wheel
    why: str = ""  # a refusal: what the release lacks
    env: str = ""  # an environment setting the serve command needs (vLLM 0.9.2's V0 engine)
    note: str = ""  # said when a refusal points at this release


def _yes(source: str, env: str = "", note: str = "") -> Serving:
    return Serving(True, source, env=env, note=note)


def _no(source: str, why: str) -> Serving:
    return Serving(False, source, why=why)


_SPECULATORS = "transformers_utils/configs/speculators/algos.py"
_NO_SPECULATORS = _no("transformers_utils/configs/ (no speculators/ reader)",
                      "this release reads no speculators-format config")
_V1_NO_MLP = _no("model_executor/models/registry.py",
                 "MLPSpeculatorPreTrainedModel is commented out of the registry (\"Temporarily disabled ... once "
                 "the MLP Speculator is supported in V1\")")
_LLAMA_EAGLE = "model_executor/models/llama_eagle.py (EagleLlamaForCausalLM), transformers_utils/configs/eagle.py"

_MEDUSA = "config/speculative.py (SpeculativeMethod \"medusa\"), model_executor/models/medusa.py"
_V0_MLP = _yes("model_executor/models/mlp_speculator.py, spec_decode/mlp_speculator_worker.py (V0), "
               "engine/arg_utils.py (_raise_or_fallback: V0 unless VLLM_USE_V1=1)", env="VLLM_USE_V1=0",
               note="the last release with V0 speculative decoding, which vLLM 0.10.0 removed (vllm-project/vllm#21152); "
                    "serve with VLLM_USE_V1=0")

# The releases read, per engine, oldest first.
RELEASES: dict[str, tuple[str, ...]] = {"vllm": ("0.9.2", "0.20.0", "0.27.0", "0.33.0"), "sglang": ("0.5.23",)}


class ServingTable:
    """(engine, kind) -> {release: Serving}, registered one (engine, kind) at a time."""

    def __init__(self):
        self._rows: dict[tuple[str, str], dict[str, Serving]] = {}

    def register(self, engine: str, kind: str, rows: dict[str, Serving]) -> None:
        unknown = set(rows) - set(RELEASES[engine])
        if unknown or (engine, kind) in self._rows:
            raise ValueError(f"{engine} {kind}: releases {sorted(unknown)} not read, or registered twice")
        self._rows[(engine, kind)] = rows

    def row(self, engine: str, version: str) -> dict[str, Serving]:
        """kind -> Serving for one release (the kinds whose export was checked against it)."""
        return {k: rows[version] for (e, k), rows in self._rows.items() if e == engine and version in rows}

    def get(self, engine: str, version: str, kind: str) -> Serving | None:
        return self._rows.get((engine, kind), {}).get(version)


SERVING = ServingTable()
SERVING.register("vllm", "eagle3", {"0.9.2": _NO_SPECULATORS, "0.20.0": _yes(f"{_SPECULATORS} (update_eagle3)"),
                                    "0.27.0": _yes(f"{_SPECULATORS} (update_eagle3)"),
                                    "0.33.0": _yes(f"{_SPECULATORS} (update_eagle3)")})
SERVING.register("vllm", "dflash", {
    "0.9.2": _NO_SPECULATORS, **dict.fromkeys(("0.20.0", "0.27.0", "0.33.0"), _yes(
        f"{_SPECULATORS} (update_dflash), model_executor/models/qwen3_dflash.py"))})
SERVING.register("vllm", "dspark", {
    "0.9.2": _NO_SPECULATORS, "0.20.0": _no(_SPECULATORS, "its speculators reader registers eagle3 and dflash only (no dspark)"),
    **dict.fromkeys(("0.27.0", "0.33.0"), _yes(f"{_SPECULATORS} (update_dspark), model_executor/models/qwen3_dspark.py"))})
SERVING.register("vllm", "peagle", {
    "0.9.2": _NO_SPECULATORS, "0.20.0": _no(_SPECULATORS, "its speculators reader registers eagle3 and dflash only (no peagle)"),
    **dict.fromkeys(("0.27.0", "0.33.0"), _yes(f"{_SPECULATORS} (update_peagle), config/speculative.py (parallel_drafting)"))})
SERVING.register("vllm", "eagle1", dict.fromkeys(RELEASES["vllm"], _yes(_LLAMA_EAGLE)))
SERVING.register("vllm", "medusa", {
    "0.9.2": _yes("model_executor/models/medusa.py, model_executor/models/registry.py (MedusaModel)"),
    "0.20.0": _yes(_MEDUSA), "0.27.0": _yes(_MEDUSA),
    "0.33.0": _no("config/speculative.py (SpeculativeMethod)",
                  "\"medusa\" is not a speculative method there and the wheel has no model_executor/models/medusa.py")})
SERVING.register("vllm", "mlp_speculator", {
    "0.9.2": _V0_MLP, "0.20.0": _V1_NO_MLP, "0.27.0": _V1_NO_MLP,
    "0.33.0": _no("config/speculative.py (SpeculativeMethod)", "\"mlp_speculator\" is not a speculative method there "
                  "and the wheel has no model_executor/models/mlp_speculator.py")})
SERVING.register("sglang", "eagle3", {"0.5.23": _yes("srt/models/llama_eagle3.py (LlamaForCausalLMEagle3)")})
SERVING.register("sglang", "eagle1", {"0.5.23": _yes(
    "srt/models/llama_eagle.py (LlamaForCausalLMEagle), srt/speculative/eagle_worker_v2.py "
    "(set_embed_and_head: the target's embedding and lm_head)")})
SERVING.register("sglang", "dflash", {"0.5.23": _yes("srt/models/dflash.py (DFlashDraftModel), srt/speculative/dflash_utils.py")})
SERVING.register("sglang", "dspark", {"0.5.23": _yes("srt/models/dspark.py (Qwen3DSparkModel)")})

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


# --------------------------------------------------------------------------- what each release serves per target


@dataclass(frozen=True)
class TargetClass:
    """One engine release's model class for targets of one HF model_type, and what it has that drafters need (the
    engine's own names: an interface, a capture method), as read from the engine's code."""

    cls: str  # the engine's model class (as its registry names it)
    source: str  # the file it was read from, inside that release
    has: frozenset  # the interfaces / methods it implements that a drafter kind may need (Need)
    why: str = ""  # the gap in its own words, where it is not the kind's Need (a class that cannot load the target)


@dataclass(frozen=True)
class Need:
    """What a target's model class must have to serve one drafter kind: every name in all_of, and one of any_of
    (when given); `what` says it in the engine's words, with the file that checks it."""

    what: str
    all_of: frozenset = frozenset()
    any_of: frozenset = frozenset()

    def met(self, has: frozenset) -> bool:
        return self.all_of <= has and (not self.any_of or bool(self.any_of & has))


def aux_state_need(need: Need):
    """A table's needs for an engine where exactly the kinds that read the target's aux hidden states (their class
    facts: required_features) need `need`, and the others need nothing of the target's model class."""
    def needs(kind: str) -> Need | None:
        from draftsmith.heads import DRAFTERS

        return need if "aux_hidden_states" in DRAFTERS.get(kind).required_features else None

    return needs


class TargetTable:
    """model_type -> {release: TargetClass, or None where the release has no model class for it}, one per engine
    format, registered by the engine's own folder (export/<engine>/targets.py) and read by can_export. Targets the
    table does not list (the attention-only families) get no refusal from it."""

    def __init__(self, fmt: str, engine: str, registry: str, releases: tuple[str, ...], needs):
        self.fmt, self.engine, self.registry, self.releases = fmt, engine, registry, releases
        self.needs = needs  # kind -> its Need of the target's model class (None: it needs nothing of it)
        self._rows: dict[str, dict[str, TargetClass | None]] = {}

    def register(self, model_types: tuple[str, ...], rows: dict[str, TargetClass | None]) -> None:
        unknown = set(rows) - set(self.releases)
        if unknown or set(model_types) & set(self._rows):
            raise ValueError(f"{self.fmt} {model_types}: releases {sorted(unknown)} not read, or registered twice")
        for model_type in model_types:
            self._rows[model_type] = rows

    def model_types(self) -> list[str]:
        return sorted(self._rows)

    def get(self, model_type: str, release: str) -> TargetClass | None:
        return self._rows[model_type].get(release)

    def serves(self, model_type: str, release: str, kind: str) -> bool:
        row = self._rows.get(model_type)
        target = row.get(release) if row is not None else None
        if row is None:
            return True
        need = self.needs(kind)
        return target is not None and not target.why and (need is None or need.met(target.has))

    def refusals(self, target_config, kind: str, version: str | None) -> list[str]:
        """One line naming the gap when release `version` (None: the newest read) cannot serve a `kind` drafter for
        a target of `target_config`; [] when it can or the table does not list its model_type."""
        model_type = str(getattr(target_config, "model_type", ""))
        release = version or self.releases[-1]
        gap = self.gap(model_type, release, kind)
        if gap is None:
            return []
        others = [r for r in self.serving_releases(model_type, kind) if r != release]
        fix = (f"{self.engine} {others[-1]} does: pass --engine-version {others[-1]}" if others
               else f"no {self.engine} release draftsmith has read does: export another kind or format")
        return [f"--to {self.fmt}: {gap}; {fix}"]

    def gap(self, model_type: str, release: str, kind: str) -> str | None:
        """Why release `release` serves no `kind` drafter for a `model_type` target, in one line naming the engine,
        the release, the model class and the file it was read from; None when it does or the table has no row."""
        if model_type not in self._rows or self.serves(model_type, release, kind):
            return None
        target = self.get(model_type, release)
        if target is None:
            return (f"{self.engine} {release} has no model class for a {model_type} target ({self.registry}), so it "
                    f"serves no {kind} drafters for it")
        return (f"{self.engine} {release} cannot serve {kind} drafters for a {model_type} target: its {target.cls} "
                f"({target.source}) " + (target.why or f"lacks {self.needs(kind).what}"))

    def serving_releases(self, model_type: str, kind: str) -> list[str]:
        """The releases read (oldest first) that serve `kind` drafters for a `model_type` target: the target's model
        class has what the kind needs, and the release serves the kind at all (SERVING)."""
        return [r for r in self.releases if self.serves(model_type, r, kind)
                and (r not in versions(self.fmt) or serving(self.fmt, r, kind).served)]


TARGETS: dict[str, TargetTable] = {}  # format -> its table (export/<engine>/targets.py registers it on import)


def target_refusals(fmt: str, version: str | None, kind: str, target_config) -> list[str]:
    """Why release `version` of format `fmt`'s engine serves no `kind` drafter for this target ([]: it does, or no
    table says otherwise)."""
    table = TARGETS.get(fmt)
    return table.refusals(target_config, kind, version) if table is not None else []


def versions(engine: str) -> list[str]:
    """The releases of `engine` whose files the table was read from, oldest first ([] for other formats)."""
    return list(RELEASES.get(engine, ()))


def resolve(fmt: str, version: str | None) -> str | None:
    """The release the export is checked against: `version` normalised (0.33, v0.33.0 -> 0.33.0), or the newest
    read when None; None for a format the table does not cover (a version given for one raises)."""
    known = versions(fmt)
    if version is None:
        return known[-1] if known else None
    if not known:
        covered = ", ".join(f"--to {e}" for e in ENGINE_NAMES)
        raise UserError(f"--engine-version applies to {covered}, not --to {fmt}; drop it")
    wanted = version.strip().removeprefix("v")
    for v in known:
        if wanted in (v, v.removesuffix(".0")):
            return v
    raise UserError(f"--engine-version {version}: draftsmith has read {ENGINE_NAMES[fmt]}'s loaders of "
                     f"{', '.join(known)} only; pass one of them (the newest is the default)")


def serving(fmt: str, version: str, kind: str) -> Serving:
    row = SERVING.get(fmt, version, kind)
    if row is None:
        return _no("(not read)", f"draftsmith has not checked {kind} exports against this release")
    return row


def releases_serving(fmt: str, kind: str) -> list[str]:
    return [v for v in versions(fmt) if serving(fmt, v, kind).served]


def check(fmt: str, version: str | None, kind: str) -> None:
    """Raise a one-line ValueError when release `version` of the engine cannot serve `kind` exports."""
    if version is None:
        return
    row = serving(fmt, version, kind)
    if row.served:
        return
    engine = ENGINE_NAMES[fmt]
    others = releases_serving(fmt, kind)
    if others:
        best = serving(fmt, others[-1], kind)
        note = f" ({best.note})" if best.note else ""
        fix = f"{engine} {others[-1]}{note} serves this export: pass --engine-version {others[-1]}"
    else:
        fix = f"no {engine} release draftsmith has read serves it: export another kind"
    raise UserError(f"--to {fmt} --engine-version {version}: {engine} {version} cannot serve a {kind} drafter "
                     f"(read from its {row.source}): {row.why}; {fix}")


def serve_command(fmt: str, version: str | None, kind: str, command: str) -> str:
    """The layout's serve command with the environment the release needs (vLLM 0.9.2: VLLM_USE_V1=0)."""
    env = serving(fmt, version, kind).env if version is not None else ""
    if not env:
        return command
    launcher = "vllm serve " if fmt == "vllm" else ""
    return command.replace(launcher, f"{env} {launcher}", 1) if launcher in command else f"{env} {command}"
