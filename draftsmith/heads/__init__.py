"""Drafter kinds: one file each, registered in DRAFTERS (heads/base.py) under their recipe name.

Importing this package imports every kind's module, which registers it. `refusals(config, kind)`
says why a kind cannot serve a target (the kind's class answers; export.refusals adds the formats')."""
from draftsmith.core.errors import UserError
from draftsmith.heads import dflash, dflash2, draft_lm, dspark, eagle1, eagle3, medusa, mlp_speculator, peagle  # noqa: F401
from draftsmith.heads.base import DRAFTERS

# The kind a recipe trains when it names none (config.DrafterConfig.kind).
DEFAULT_KIND = eagle3.Eagle3Drafter.kind


def draft_model_kind() -> str:
    """The kind that runs any causal LM sharing the target's tokenizer as a drafter (`eval --draft-model`)."""
    (kind,) = [name for name in DRAFTERS.names() if DRAFTERS.get(name).is_draft_model]
    return kind


def refusals(config, kind: str) -> list[str]:
    """Why drafter kind `kind` cannot serve a target of transformers `config`; [] when it can. Each reason
    names the unsupported feature and what to do instead."""
    from draftsmith.targets.archs import config_refusals

    if kind not in DRAFTERS:
        return [f"drafter kind {kind!r} is unknown (known: {DRAFTERS.names()})"]
    return config_refusals(config) or DRAFTERS.get(kind).refusals(config)


def check_for_training(target, kind: str, options=None) -> None:
    """`draftsmith train`'s check before loading data: the refusals `draftsmith inspect` prints, as one error;
    then the drafter's options against this target (options: the kind's Config; aux layer ids in range)."""
    from draftsmith.targets import cache_check

    reasons = refusals(target.config, kind)
    if not reasons:
        status, detail = cache_check.check(target.config)  # once per training run: a small fp32 copy, no real weights
        if status == "failed":
            reasons = [detail]
    if reasons:
        raise UserError(f"drafter.kind {kind!r} cannot train for target {target.name} "
                         f"({target.config.model_type}): " + "; ".join(reasons)
                         + f" (see `draftsmith inspect {target.path}`)")
    if options is not None:
        DRAFTERS.get(kind).feature_layers_for(options, target)  # raises one line naming drafter.aux_layer_ids
        DRAFTERS.get(kind).check_training_start(options, target)  # the kind's own start (a warm start's source)
