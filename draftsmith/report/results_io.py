"""Load, validate and merge eval result files (docs/results-schema.md).

    results, skipped = load_results(["results/", "other-machine/run.json"])

Rules:
- A file that is not a well-formed result (bad JSON, wrong "schema", a missing or mistyped key)
  is reported by name in `skipped` and left out; the others are still read.
- Results counted under different `definitions` or written with different `schema_version`s are
  refused (IncompatibleResultsError), never mixed; so are versions this code does not know.
- Merging never drops rows: every (file, workload) pair becomes a row, even when two runs share
  the same (target, drafter, workload, k, temperature, hardware) key. Only the same file named
  twice (same resolved path) is read once.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.core import files
from draftsmith.core.errors import UserError

SCHEMA_NAME = "draftsmith.eval-results"
SUPPORTED_SCHEMA_VERSIONS = (1,)
SUPPORTED_DEFINITIONS = ("draftsmith-v1",)


class MalformedResultError(UserError):
    """One result file does not follow docs/results-schema.md."""


class IncompatibleResultsError(UserError):
    """Result files use different (or unknown) definitions or schema versions."""


@dataclass
class Result:
    """One validated result file."""

    path: Path
    data: dict[str, Any]
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def schema_version(self) -> int:
        return self.data["schema_version"]

    @property
    def definitions(self) -> str:
        return self.data["definitions"]

    @property
    def command(self) -> str:
        return self.data.get("command") or ""

    @property
    def k(self) -> int:
        return int(self.data["config"]["k"])

    @property
    def temperature(self) -> float:
        return float(self.data["config"]["temperature"])

    @property
    def verification(self) -> str:
        """The verification rule (results before the field existed: greedy iff temperature is 0)."""
        return str(self.data["config"].get("verification") or ("greedy" if self.temperature == 0 else "stochastic"))

    @property
    def max_new_tokens(self) -> int | None:
        value = self.data["config"].get("max_new_tokens")
        return int(value) if isinstance(value, int) else None

    @property
    def sampling(self) -> tuple:
        """(top_k, top_p): the rest of the sampling transform besides the temperature."""
        cfg = self.data["config"]
        top_k, top_p = cfg.get("top_k"), cfg.get("top_p")
        return (int(top_k) if isinstance(top_k, (int, float)) else 0, float(top_p) if isinstance(top_p, (int, float)) else 1.0)

    @property
    def tree_budget(self) -> int | None:
        """Draft-tree size for tree decoding (config.tree_budget); None for chain drafting (k)."""
        value = self.data["config"].get("tree_budget")
        return int(value) if isinstance(value, int) else None

    @property
    def target_name(self) -> str:
        return self.data["target"]["name"]

    @property
    def trainable_params(self) -> int | None:
        """Trainable parameters of a trained drafter (results from `draftsmith eval CKPT`); None otherwise."""
        value = self.data["drafter"].get("trainable_params")
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def drafter_kind(self) -> str:
        return self.data["drafter"]["kind"]

    @property
    def drafter_name(self) -> str:
        """The drafter's name; tree runs add their shape, so a tree row never shares a key with the
        chain row of the same k (k is then the tree depth; the verify budget is in the name)."""
        tree = self.data["config"].get("tree")
        if tree:
            return f"{self.data['drafter']['name']} tree:{tree['kind']} b={tree['budget']} K={tree['topk']}"
        return self.data["drafter"]["name"]

    @property
    def hardware(self) -> str:
        return hardware_label(self.data["hardware"])

    @property
    def training_log(self) -> str | None:
        return self.data.get("training_log")


def hardware_label(hw: dict[str, Any]) -> str:
    """A stable name for the machine; speed is only ranked among rows with the same label."""
    device = hw.get("device") or "unknown"
    name = hw.get("device_name") or hw.get("cpu") or "unknown"
    label = f"{device}: {name}"
    if str(device).startswith("cpu") and hw.get("num_threads"):
        label += f" ({hw['num_threads']} threads)"
    return label


def _get(obj: dict, dotted: str, types: tuple, where: str, optional: bool = False) -> Any:
    """obj["a"]["b"] for dotted "a.b", type-checked; raises MalformedResultError naming the key."""
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            if optional:
                return None
            raise MalformedResultError(f"{where}: missing key '{dotted}' (see docs/results-schema.md)")
        cur = cur[part]
    if cur is None and optional:
        return None
    if isinstance(cur, bool) and bool not in types:
        raise MalformedResultError(f"{where}: key '{dotted}' is a bool, expected {'/'.join(t.__name__ for t in types)}")
    if not isinstance(cur, types):
        names = "/".join(t.__name__ for t in types)
        raise MalformedResultError(f"{where}: key '{dotted}' is {type(cur).__name__} {str(cur)[:60]}, expected {names}")
    if isinstance(cur, int) and float in types and abs(cur) > 2**1000:  # 10**400: OverflowError in float()
        raise MalformedResultError(f"{where}: key '{dotted}' is an integer of {len(str(abs(cur)))} digits, "
                                   "expected a finite number")
    if isinstance(cur, str) and len(cur) > MAX_TEXT.get(dotted, MAX_NAME):
        raise MalformedResultError(f"{where}: key '{dotted}' is {len(cur):,} characters long, more than "
                                   f"{MAX_TEXT.get(dotted, MAX_NAME):,}")
    return cur


MAX_NAME = 256  # characters of a name in a result (target, drafter, workload, device): a 5 MB name hung plots
MAX_TEXT = {"command": 65536, "training_log": 4096}
MAX_WORKLOADS = 1000  # workloads in one result (3,001 hung leaderboard and report)


NUM = (int, float)
# aggregate keys every row needs (acceptance), then keys shown when present (speed, memory).
_REQUIRED_AGG = ("acceptance_length.mean",)
_OPTIONAL_AGG = ("acceptance_length.pooled", "tpot_speedup.median", "new_tokens", "rounds", "speedup.median", "speedup.p10", "speedup.p90", "spec_tokens_per_s.median",
                 "target_tokens_per_s.median", "ttft_s.median", "tpot_s.median", "latency_s.p90",
                 "peak_memory_mb", "costs.draft_step_s", "costs.verify_forward_s", "costs.target_step_s",
                 "time_split.draft", "time_split.verify", "time_split.overhead", "time_per_round_s.overhead",
                 "costs.round_overhead_s")
# objects the report reads fields from: a list or a number in their place is malformed, not absent
_AGG_SECTIONS = sorted({key.split(".")[0] for key in _OPTIONAL_AGG if "." in key})


MAX_SPEEDUP = 1000.0  # no speculative loop is a thousand times faster than its target alone
_SPEEDUP_KEYS = ("speedup.median", "speedup.p10", "speedup.p90", "tpot_speedup.median")


def _check_ranges(agg: dict, k: int, at: str) -> None:
    """Values a received file could forge to rank first: no infinity, tau in [1, k + 1], alpha in [0, 1],
    speedups in (0, MAX_SPEEDUP]. NaN stays "not measured" (shown as —, never ranked) except in the
    required acceptance length."""
    for key in _REQUIRED_AGG + _OPTIONAL_AGG + ("acceptance_rate",):
        value = _get(agg, key, NUM, at, optional=True)
        if value is not None and (math.isinf(value) or (key in _REQUIRED_AGG and value != value)):
            raise MalformedResultError(f"{at}: key '{key}' is {value}, expected a finite number")

    def present(key):
        value = _get(agg, key, NUM, at, optional=True)
        return None if value is None or value != value else value

    for key in ("acceptance_length.mean", "acceptance_length.pooled"):
        tau = present(key)
        if tau is not None and not 1.0 - 1e-9 <= tau <= k + 1 + 1e-9:
            raise MalformedResultError(f"{at}: key '{key}' is {tau:g}, outside [1, k + 1 = {k + 1}] "
                                       "(acceptance length counts committed tokens per round)")
    alpha = present("acceptance_rate")
    if alpha is not None and not 0.0 <= alpha <= 1.0:
        raise MalformedResultError(f"{at}: key 'acceptance_rate' is {alpha:g}, outside [0, 1]")
    for key in _SPEEDUP_KEYS:
        value = present(key)
        if value is not None and not 0.0 < value <= MAX_SPEEDUP:
            raise MalformedResultError(f"{at}: key '{key}' is {value:g}, outside (0, {MAX_SPEEDUP:g}]")


def validate(data: Any, where: str) -> dict[str, dict[str, Any]]:
    """Check one parsed result against docs/results-schema.md; returns its workloads.

    Raises MalformedResultError naming `where` (the file), the workload and the key.
    """
    if not isinstance(data, dict):
        raise MalformedResultError(f"{where}: top level is {type(data).__name__}, expected a JSON object")
    schema = data.get("schema")
    if schema != SCHEMA_NAME:
        raise MalformedResultError(f"{where}: 'schema' is {schema!r}, expected {SCHEMA_NAME!r}; "
                                   "is this a file written by `draftsmith eval`?")
    _get(data, "schema_version", (int,), where)
    _get(data, "definitions", (str,), where)
    k = _get(data, "config.k", (int,), where)
    _get(data, "config.temperature", NUM, where)
    for key in ("target.name", "drafter.kind", "drafter.name", "hardware.device"):
        _get(data, key, (str,), where)
    _get(data, "command", (str,), where, optional=True)
    _get(data, "training_log", (str,), where, optional=True)
    workloads = _get(data, "workloads", (dict,), where)
    if not workloads:
        raise MalformedResultError(f"{where}: 'workloads' is empty; a result needs at least one workload")
    if len(workloads) > MAX_WORKLOADS:
        raise MalformedResultError(f"{where}: 'workloads' holds {len(workloads):,} workloads, more than {MAX_WORKLOADS:,}")
    long = next((name for name in workloads if len(name) > MAX_NAME), None)
    if long is not None:
        raise MalformedResultError(f"{where}: a workload name is {len(long):,} characters long, more than {MAX_NAME}")
    for name, wl in workloads.items():
        at = f"{where} [workload {name!r}]"
        agg = _get(wl if isinstance(wl, dict) else {}, "aggregate", (dict,), at)
        for key in _REQUIRED_AGG:
            _get(agg, key, NUM, at)
        if "acceptance_rate" not in agg:  # null: nothing was proposed (k = 0, or no n-gram match)
            raise MalformedResultError(f"{at}: missing key 'acceptance_rate' (see docs/results-schema.md)")
        _get(agg, "acceptance_rate", NUM, at, optional=True)
        for key in _AGG_SECTIONS:
            _get(agg, key, (dict,), at, optional=True)
        for key in _OPTIONAL_AGG:
            _get(agg, key, NUM, at, optional=True)
        _check_ranges(agg, k, at)
        if wl.get("engine") is not None:  # eval --engine: the same drafter in a real engine
            for key in ("engine.acceptance_length", "engine.acceptance_rate", "engine.decode_speedup.median"):
                _get(wl, key, NUM, at, optional=True)
            _get(wl, "engine.name", (str,), at)
        ppa = _get(agg, "per_position_acceptance", (list,), at)
        # null / NaN: a position no round reached (its conditional acceptance is undefined).
        ok = all(a is None or (isinstance(a, NUM) and not isinstance(a, bool) and (a != a or 0.0 <= a <= 1.0))
                 for a in ppa)
        if len(ppa) != k or not ok:
            raise MalformedResultError(f"{at}: 'per_position_acceptance' must hold k={k} numbers in [0, 1] "
                                       f"(or null for unreached positions), got {ppa!r:.80}")
    return workloads


def load_result(path: str | Path) -> Result:
    """Read and validate one result file; raises MalformedResultError naming the file."""
    path = Path(path)
    try:
        data = json.loads(files.read_received_text(path, "results file", files.MAX_RESULT_BYTES))
    except UserError as err:  # a FIFO, /dev/zero, past the size bound, not UTF-8
        raise MalformedResultError(str(err)) from None
    except OSError as err:
        raise MalformedResultError(f"{path}: cannot read: {err}") from err
    except json.JSONDecodeError as err:
        raise MalformedResultError(f"{path}: not valid JSON ({err})") from err
    except RecursionError:
        raise MalformedResultError(f"{path}: not valid JSON (nested too deeply)") from None
    workloads = validate(data, str(path))
    return Result(path=path, data=data, workloads=workloads)


def expand_paths(paths: list[str | Path]) -> list[Path]:
    """Files as given; directories become their *.json files (recursively, sorted)."""
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(p.rglob("*.json")) if p.is_dir() else [p])
    return out


def check_compatible(results: list[Result]) -> None:
    """Refuse results counted under different definitions or schema versions (or unknown ones)."""
    if not results:
        return
    groups: dict[tuple[int, str], list[str]] = {}
    for r in results:
        groups.setdefault((r.schema_version, r.definitions), []).append(str(r.path))
    if len(groups) > 1:
        lines = [f"  schema_version={v} definitions={d!r}: {', '.join(files)}" for (v, d), files in sorted(groups.items())]
        raise IncompatibleResultsError(
            "refusing to mix results with different definitions or schema versions:\n" + "\n".join(lines)
            + "\nPass only files of one kind (rerun the others with the current `draftsmith eval`).")
    (version, definitions), = groups
    if version not in SUPPORTED_SCHEMA_VERSIONS or definitions not in SUPPORTED_DEFINITIONS:
        raise IncompatibleResultsError(
            f"results use schema_version={version} definitions={definitions!r}; this draftsmith reads "
            f"schema_version in {SUPPORTED_SCHEMA_VERSIONS} with definitions in {SUPPORTED_DEFINITIONS}. "
            "Upgrade draftsmith or rerun the eval with this version.")


def load_results(paths: list[str | Path]) -> tuple[list[Result], list[str]]:
    """Load many result files (or directories of them) from any number of machines or runs.

    Returns (results, skipped): malformed files are skipped and described in `skipped`, one
    message per file naming it. Raises IncompatibleResultsError when the readable files mix
    definitions or schema versions, and FileNotFoundError when no path was given at all.
    """
    files = expand_paths(paths)
    if not files:
        raise FileNotFoundError(f"no result files found in {[str(p) for p in paths]}")
    results: list[Result] = []
    skipped: list[str] = []
    seen: set[Path] = set()
    for f in files:
        key = f.resolve()
        if key in seen:
            continue
        seen.add(key)
        try:
            results.append(load_result(f))
        except MalformedResultError as err:
            skipped.append(str(err))
    check_compatible(results)
    return results, skipped
