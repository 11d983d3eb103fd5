"""The results schema: the files of a run directory, the typed record of a row, and one reader for each file.

``experiments/`` writes run directories and ``analysis/`` reads them; both take the record and the readers from
here, so the two sides cannot drift apart. Plain Python and json (yaml and scipy are imported inside the functions
that need them), so writing results pulls in neither pandas nor the analysis code.

A row is a ``Row``: the run's ``RunIdentity``, its options' own parameters, the ``Condition`` it was measured in,
its ``PromptColumns``, its ``Metrics``, which ``Metrics.measure`` builds from the two decoders' ``DecodeStats``, and
its ``Outputs`` (the tokens both runs emitted). A run's summary (``summarize_rows``) holds per-prompt means and the
pooled figures (``pooled``), each with its interval, and names the prompts too short to time.
The column lists below are read off these records, and the tables of docs/results-schema.md are
``schema_tables()``. A run directory holds (docs/run-directories.md says what each guarantees)

    config.yaml             the resolved config, written atomically before the first prompt
    rows.jsonl              one JSON object per prompt, appended and fsynced as each prompt finishes
    summary.json            written at the end; its absence marks a partial (killed) run
    run.lock                held by the one process writing the directory; removed when it ends
    rows.set-aside.jsonl    what resume moved out of rows.jsonl: unreadable pieces, duplicate and stale rows
    failure.json            a sweep job that ended with an error: its exit code and the one-line error
    <file>.damaged          a file resume could not read, moved aside whole (config.yaml.damaged, ...)

Every reader survives damage: it returns what it could read and says in one line what it could not (``Read``), or
lists the pieces it left out (``RowsRead``). None raises on what it finds in a file.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import NamedTuple

from specdec.stats import DecodeStats, ratio

CONFIG, ROWS, SUMMARY, SET_ASIDE = "config.yaml", "rows.jsonl", "summary.json", "rows.set-aside.jsonl"
FAILURE, LOCK = "failure.json", "run.lock"
DAMAGED_SUFFIX = ".damaged"


def column(meaning: str):
    """A field of a row record: one column, with the meaning docs/results-schema.md gives it."""
    return field(metadata={"meaning": meaning})


@dataclass(frozen=True)
class RunIdentity:
    """The setting every row of one run shares (``batch_size`` aside: the rows of a row's own batch)."""

    run_id: str = column("unique per run")
    group: str = column("shared by all runs of one sweep (W&B group)")
    pair: str = column("model pair preset, e.g. `embedded`, `gpt2-xl`")
    system: str = column(
        "what decoded the measured side: `specdec` (our loop, speculative), `hf_generate` (transformers' "
        "`generate()`), `hf_assisted` (transformers' assisted generation); the baseline is always our loop's")
    system_settings: str | None = column(
        "how a transformers system was called (its generation options), null for `specdec`")
    drafter: str = column("the drafter's `name`: `model`, `ngram`, `early_exit`, `tree`, `dynamic_tree`, "
                          "`cross_tokenizer`, or a custom drafter's own")
    strategy: str = column("the strategy's `name`: `greedy`, `speculative`, `typical`, `topk`, `synthetic`, or a "
                           "custom strategy's own")
    lossless: bool | None = column(
        "whether the strategy's output follows the target distribution exactly (false for `typical`, `topk`, "
        "`synthetic`, and `speculative` with lenience < 1)")
    draft_length: str = column("the draft-length policy's `name`: `fixed`, `heuristic`, `confidence`, "
                               "`cost_optimal`, or a custom policy's own")
    k: int = column("draft length (max draft length for adaptive policies)")
    sampling: str = column("the sampling settings in short, from their values: `greedy` (temperature 0), "
                           "`T=0.7`, `T=0.7, top_p=0.9`")
    temperature: float = column("sampling temperature (0: argmax)")
    top_k: int | None = column("top-k filter, null for none")
    top_p: float | None = column("top-p filter, null for none")
    min_p: float | None = column("min-p filter, null for none")
    max_new_tokens: int = column("tokens generated per prompt at most")
    seed: int = column("the run's sampling seed (each batch's calls mix it with the batch's prompt ids), the same for both decoders")
    batch_size: int = column("rows decoded in one batch with this one, itself included (they share its timings)")
    data: str = column("prompt set (`data.source`)")
    device: str = column("device the pair ran on, e.g. `cpu`, `cuda:0`")
    dtype: str = column("parameter dtype, e.g. `float32`")
    compile: bool = column("`compile=true`: compiled forwards over static caches (CUDA graphs on CUDA); false: eager")
    forward: str = column("the models' forward as configured: `auto`, `lean` or `transformers`")
    stop_at_eos: bool = column("whether a prompt ends at the tokenizer's EOS token")
    threads: int | None = column("torch CPU threads, null for torch's default")
    warmup: int = column("untimed warm-up rounds before the first timed prompt (a round repeats the speculative call "
                         "while its policy still measures the machine)")


@dataclass(frozen=True)
class Condition:
    """Where and beside what a row was measured: neither a setting to compare nor a metric, but what its timings
    depend on."""

    host: str = column("the machine (host name) that decoded the row")
    concurrent_jobs: int | None = column(
        "jobs of the row's sweep running on its machine while it was decoded, itself included (the larger count, "
        "before or after its batch); 1 for a single run. Above 1, its timings were shared with other jobs. Null "
        "where the file system gave no locks to count with")
    load_before: float | None = column(
        "the machine's 1-minute load average just before the row's batch was decoded (all its processes, not only "
        "the sweep's); null where the system gives none. Absent in rows written before it existed")
    load_after: float | None = column("... just after it")


@dataclass(frozen=True)
class Provenance:
    """What produced a row: the code, the library versions, the weights, the processor. Runs that differ in code or
    weights (``CODE_AND_WEIGHTS``) are never reported as one setting. Absent in rows written before it existed."""

    git_commit: str | None = column("the commit of the specdec checkout that ran, null outside a git checkout")
    git_dirty: bool | None = column("whether that checkout had changes not committed (tracked files), null outside one")
    specdec_version: str = column("specdec's version")
    torch_version: str = column("torch's version, e.g. `2.13.0+cpu`")
    transformers_version: str = column("transformers' version")
    target_weights: str | None = column(
        "16 hex digits of SHA-256 over the target's state dict (names, dtypes, shapes, bytes): the same digits mean "
        "the same weights in the same dtype")
    drafter_weights: str | None = column(
        "the same over the weights the drafter runs apart from the target's (a draft model, EAGLE or Medusa heads); "
        "null for a drafter without weights of its own (n-gram, early exit, none)")
    processor: str = column("the processor that decoded: the GPU's name on CUDA, else the CPU's model name")
    torch_threads: int = column("the CPU threads torch used (`torch.get_num_threads()`), whether set or default")


@dataclass(frozen=True)
class PromptColumns:
    """Which prompt a row decoded."""

    prompt_id: str = column("the prompt set's id for it, or its `prompt_hash` where the set gives none")
    prompt_hash: str = column(
        "the prompt's identity: 12 hex digits of SHA-256 over its source's name and its text. Resume and analysis "
        "key rows by it, so an edited prompt file never pairs a row with another text")
    prompt_tokens: int = column("prompt length in tokens")
    category: str | None = column(
        "the prompt's category where its set gives one (a task suite's: MT-bench's `writing`, ..., `humaneval`, "
        "`prose`), else null")
    round: int = column(
        "which repeat of the prompt's interleaved baseline/speculative pair (0 .. `rounds` - 1); rows written before "
        "rounds existed hold none and count as round 0")
    batch_hash: str | None = column(
        "the `prompt_hash` of its batch's first prompt (its own at batch size 1): rows that share it were decoded in "
        "the same calls and share their timings, so the pooled intervals resample batches; null in rows written "
        "before it existed (each prompt then counts as its own batch)")


@dataclass(frozen=True)
class Metrics:
    """The per-prompt measurements ("spec" = the speculative run, "baseline" = the autoregressive run of the same
    loop on the same prompt). Counts are the row's own; timings and what derives from them describe its batch."""

    emitted: int = column("E: tokens the speculative run emitted")
    drafted: int = column("D: draft tokens proposed (a tree's nodes)")
    accepted: int = column("A: draft tokens accepted, up to the row's EOS (a draft past it never counts, whichever "
                           "drafter proposed it)")
    target_calls: int = column(
        "N: target calls that emitted tokens: the prefill's forward, which also verifies the first draft, and the "
        "verification passes after it")
    draft_calls: int = column("draft forward passes in decode steps (batch)")
    acceptance_rate: float = column("A / D; null when nothing was drafted")
    mean_accepted_length: float = column(
        "tau = E / N, tokens per target call, the bonus token included (plain decoding has tau = 1): EAGLE's "
        "acceptance length, Spec-Bench's mean accepted tokens. vLLM's acceptance length divides by the calls that "
        "drafted instead (1 + A / sum of accepted_histogram; `vllm_acceptance_length` in summary.json): N also "
        "counts a call that drafted nothing (a head's first call, a last call with no room) and E stops at EOS")
    per_position_acceptance: list[float | None] = column(
        "length k: a_i = P(draft token i accepted given 1..i-1 accepted), per depth for a tree; null where never "
        "reached. vLLM's per-position acceptance rate is unconditional: a_1 a_2 ... a_i")
    per_position_attempts: list[int] = column(
        "length k: times draft position i was verified (the denominator of a_i). Absent in rows written before it "
        "existed")
    per_position_accepted: list[int] = column(
        "length k: times draft position i was accepted (the numerator of a_i). Absent in rows written before it "
        "existed")
    accepted_histogram: list[int] = column(
        "length k + 1: h_j = verification steps that drafted and kept j drafts (the bonus token not counted), "
        "j = 0..k (vLLM's per-request acceptance histogram); sum_j j h_j = accepted, counted as A is (up to the "
        "row's EOS); sum_j h_j = the calls that drafted. Absent in rows written before it existed")
    k_histogram: list[int] = column(
        "length k + 1: steps the row generated in, by the draft length k they drafted, k = 0..k (0: a plain decode "
        "step); sums to target_calls. What an adaptive policy chose. Absent in rows written before it existed")
    modelled_step_seconds: float | None = column(
        "a policy that models step costs (`cost_optimal`): its mean predicted seconds per decode step for the k it "
        "chose, this batch; null for other policies. Absent in rows written before it existed")
    measured_step_seconds: float | None = column(
        "... and the mean seconds those steps took (batch). Absent in rows written before it existed")
    expected_acceptance: float | None = column(
        "mean over verified positions of sum_x min(p_draft(x), p_target(x)), with p_draft the point mass at the "
        "draft where the drafter gives no distributions (n-gram); null when nothing was verified (batch)")
    draft_seconds: float = column("wall time of the speculative run spent drafting, draft prefill included (batch)")
    target_seconds: float = column("... spent in target forwards, prefill included (batch)")
    other_seconds: float = column("... spent elsewhere (batch)")
    spec_seconds: float = column("wall time of the speculative run (batch)")
    baseline_seconds: float = column("wall time of the baseline run (batch)")
    baseline_emitted: int = column("tokens the baseline run emitted")
    spec_tokens_per_s: float = column("emitted / spec_seconds (batch)")
    baseline_tokens_per_s: float = column("baseline emitted / baseline_seconds (batch)")
    speedup: float = column("baseline seconds per token / spec seconds per token (batch)")
    cost_ratio: float = column(
        "c = mean draft forward time / mean target forward time over the decode steps (prefills excluded), this "
        "run (batch); where steps run on the device (not timed by phase), the same forwards timed apart once per run")
    cost_ratio_source: str | None = column(
        "where cost_ratio comes from: 'steps' (this batch's decode steps), 'profile' (the run's draft forward and "
        "target verify forward of k + 1 tokens timed apart at warm-up, as the device step runs them), null (none). "
        "Absent in rows written before it existed")
    predicted_speedup: float = column(
        "Leviathan et al. (2023) eq. 1: (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)) with alpha = acceptance_rate "
        "and k the drafts per step that drafted (drafted / sum of accepted_histogram: what the steps drafted, not "
        "the configured k, which a drafter with fewer heads or an adaptive policy does not reach); null for a tree "
        "(the formula is for chains)")
    ttft_seconds: float = column(
        "time to the first step's tokens (the prefill's call, which may emit k + 1), speculative run (batch)")
    itl_seconds: float = column("mean time per token after the first step, speculative run (batch)")
    baseline_ttft_seconds: float = column("ttft_seconds of the baseline run (batch)")
    baseline_itl_seconds: float = column("itl_seconds of the baseline run (batch)")
    compile_seconds: float | None = column(
        "wall time of the run's untimed warm-up, where a compiled run (`compile=true`) compiles every shape it "
        "decodes, apart from the timings above (run); null for an eager run")

    @classmethod
    def measure(cls, spec: DecodeStats, base: DecodeStats, row: int, tree: bool,
                compile_seconds: float | None = None, profiled_cost_ratio: float | None = None,
                step_costs: tuple[float, float] | None = None) -> Metrics:
        """Row ``row`` of a batch that both decoders ran: its own counts, the batch's timings (specdec.stats's
        definitions). Leviathan's predicted speedup is for chains, so a token tree (``tree``) gets none; a chain's
        takes the k its steps drafted (drafted / steps that drafted), never a configured one.
        ``compile_seconds``: the run's warm-up, where it compiled (None: eager). ``profiled_cost_ratio``: the cost
        ratio of the run's forwards timed apart, for steps whose phases are not timed (the device step).
        ``step_costs``: the policy's (modelled, measured) mean seconds per decode step (``step_costs()``)."""
        counts = spec.rows[row]
        acceptance, cost_ratio = counts.acceptance_rate, spec.cost_ratio
        cost_ratio_source = "steps" if math.isfinite(cost_ratio) else None
        if cost_ratio_source is None and profiled_cost_ratio is not None:
            cost_ratio, cost_ratio_source = profiled_cost_ratio, "profile"
        drafted_k = ratio(counts.drafted, sum(counts.steps_by_accepted))  # drafts per step that drafted
        chain_prediction = not tree and math.isfinite(acceptance) and math.isfinite(cost_ratio)
        return cls(
            emitted=counts.emitted,
            drafted=counts.drafted,
            accepted=counts.accepted,
            target_calls=counts.target_calls,
            draft_calls=spec.draft_forwards,
            acceptance_rate=acceptance,
            mean_accepted_length=counts.mean_accepted_length,
            per_position_acceptance=counts.per_position,
            per_position_attempts=counts.position_attempts,
            per_position_accepted=counts.position_accepts,
            accepted_histogram=counts.steps_by_accepted,
            k_histogram=counts.steps_by_k,
            modelled_step_seconds=None if step_costs is None else step_costs[0],
            measured_step_seconds=None if step_costs is None else step_costs[1],
            expected_acceptance=spec.expected_acceptance,
            draft_seconds=spec.draft_seconds,
            target_seconds=spec.target_seconds,
            other_seconds=spec.other_seconds,
            spec_seconds=spec.wall_seconds,
            baseline_seconds=base.wall_seconds,
            baseline_emitted=base.rows[row].emitted,
            spec_tokens_per_s=spec.tokens_per_second,
            baseline_tokens_per_s=base.tokens_per_second,
            speedup=ratio(ratio(base.wall_seconds, base.emitted), ratio(spec.wall_seconds, spec.emitted)),
            cost_ratio=cost_ratio,
            cost_ratio_source=cost_ratio_source,
            predicted_speedup=leviathan_speedup(acceptance, drafted_k, cost_ratio) if chain_prediction else math.nan,
            ttft_seconds=spec.ttft_seconds,
            itl_seconds=spec.itl_seconds,
            baseline_ttft_seconds=base.ttft_seconds,
            baseline_itl_seconds=base.itl_seconds,
            compile_seconds=compile_seconds,
        )

    @classmethod
    def measure_system(cls, seconds: float, emitted: int, target_calls: int, base: DecodeStats, row: int,
                       compile_seconds: float | None = None) -> Metrics:
        """Row ``row`` of a prompt that another system (transformers) decoded in ``seconds``, emitting ``emitted``
        tokens in ``target_calls`` target forwards, beside our baseline's ``base``: what such a system lets one
        count (tau, time, speedup); what it does not report (drafts, acceptance, phases) is undefined."""
        spec_per_token = ratio(seconds, emitted)
        return cls(
            emitted=emitted, drafted=None, accepted=None, target_calls=target_calls, draft_calls=None,
            acceptance_rate=math.nan, mean_accepted_length=ratio(emitted, target_calls),
            per_position_acceptance=[], per_position_attempts=[], per_position_accepted=[], accepted_histogram=[],
            k_histogram=[], modelled_step_seconds=None, measured_step_seconds=None, expected_acceptance=None,
            draft_seconds=math.nan, target_seconds=math.nan, other_seconds=math.nan,
            spec_seconds=seconds, baseline_seconds=base.wall_seconds, baseline_emitted=base.rows[row].emitted,
            spec_tokens_per_s=ratio(emitted, seconds), baseline_tokens_per_s=base.tokens_per_second,
            speedup=ratio(ratio(base.wall_seconds, base.emitted), spec_per_token), cost_ratio=math.nan,
            cost_ratio_source=None, predicted_speedup=math.nan, ttft_seconds=math.nan, itl_seconds=math.nan,
            baseline_ttft_seconds=base.ttft_seconds, baseline_itl_seconds=base.itl_seconds,
            compile_seconds=compile_seconds,
        )


@dataclass(frozen=True)
class Outputs:
    """What the two runs of a prompt emitted, so that a lossy rule's quality can be judged after the fact."""

    tokens: list[int] = column("the token ids the measured run emitted (up to and including EOS)")
    baseline_tokens: list[int] = column("the token ids the baseline run emitted")
    identical_output: bool | None = column(
        "at temperature 0: whether `tokens` equals `baseline_tokens` (a lossless rule must give true); null when "
        "sampling, where two exact samplers differ by chance")
    log_likelihood: float | None = column(
        "for a lossy rule: the target's mean log-probability per token of `tokens` given the prompt and the tokens "
        "before (raw logits, temperature 1); null for a lossless rule")
    baseline_log_likelihood: float | None = column(
        "for a lossy rule: the same of `baseline_tokens`, the target's own decoding, to compare quality with")

    @classmethod
    def of(cls, tokens: list[int], baseline_tokens: list[int], greedy: bool,
           log_likelihoods: tuple[float, float] | None = None) -> Outputs:
        """The outputs of one prompt; ``log_likelihoods``: (measured, baseline), given for a lossy rule."""
        measured, baseline = log_likelihoods if log_likelihoods is not None else (None, None)
        return cls(list(tokens), list(baseline_tokens), list(tokens) == list(baseline_tokens) if greedy else None,
                   measured, baseline)


@dataclass(frozen=True)
class Row:
    """One line of rows.jsonl: one prompt of one run. ``options`` holds every other parameter of the swept groups
    as ``<group>_<key>`` (``strategy_lenience``, ``drafter_branching`` = "2-2-1-1")."""

    identity: RunIdentity
    options: dict
    condition: Condition
    provenance: Provenance
    prompt: PromptColumns
    metrics: Metrics
    outputs: Outputs

    def to_json(self) -> dict:
        """The flat object rows.jsonl holds, in column order; undefined metrics (NaN) as null."""
        parts = (asdict(self.identity), self.options, asdict(self.condition), asdict(self.provenance),
                 asdict(self.prompt),
                 asdict(self.metrics), asdict(self.outputs))
        return json_ready({key: value for part in parts for key, value in part.items()})


# The records whose fields are a row's columns, in row order (a row's options sit between the first two).
SCHEMA_RECORDS = (RunIdentity, Condition, Provenance, PromptColumns, Metrics, Outputs)


def names(record) -> tuple[str, ...]:
    return tuple(f.name for f in fields(record))


IDENTITY_COLUMNS = names(RunIdentity)
CONDITION_COLUMNS = names(Condition)
PROVENANCE_COLUMNS = names(Provenance)
# Provenance that makes results differ (the code that ran, the weights it ran): runs differing here are never pooled
# or ranked as one setting. The rest (processor, threads) is where they ran, like a condition.
CODE_AND_WEIGHTS = ("git_commit", "git_dirty", "specdec_version", "torch_version", "transformers_version",
                    "target_weights", "drafter_weights")
PROMPT_COLUMNS = names(PromptColumns)
METRIC_COLUMNS = names(Metrics)
OUTPUT_COLUMNS = names(Outputs)
# Columns whose value is a list (per draft position, or token ids); a W&B table holds them as JSON text.
LIST_COLUMNS = tuple(f.name for record in (Metrics, Outputs) for f in fields(record) if str(f.type).startswith("list"))
# What makes a JSON object a row: which run, which prompt.
ROW_KEY = ("run_id", "prompt_id")
# Metrics summarised per run as the mean over prompts with a 95% Student t interval (summary.json, analysis/).
# (predicted_speedup is not among them: a run has one, from its pooled counts, ``pooled_predicted_speedup``.)
INTERVAL_METRICS = (
    "speedup", "acceptance_rate", "mean_accepted_length", "spec_tokens_per_s", "baseline_tokens_per_s",
    "cost_ratio",
)
# Where a summarised metric can lie: its interval is clipped to this range (a t interval on few, spread-out prompts
# can reach below 0 or above 1).
METRIC_RANGES = {
    "speedup": (0.0, math.inf), "acceptance_rate": (0.0, 1.0), "mean_accepted_length": (0.0, math.inf),
    "spec_tokens_per_s": (0.0, math.inf), "baseline_tokens_per_s": (0.0, math.inf), "cost_ratio": (0.0, math.inf),
}
MIN_PROMPTS_FOR_INTERVAL = 3  # with 2, t_{0.975, 1} = 12.7: an "interval" that says nothing


def annotation_types(annotation: str, nullable: bool) -> tuple[type, ...]:
    """The JSON-level Python types a field annotated ``annotation`` may hold ("float | None" -> float, int,
    NoneType); ``nullable``: null is allowed whatever the annotation (a metric that is undefined)."""
    parts = ["list"] if annotation.startswith("list") else [part.strip() for part in annotation.split("|")]
    known = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "None": (type(None),),
             "list": (list,)}
    return tuple({kind for part in parts for kind in known[part]} | ({type(None)} if nullable else set()))


# Column -> (its annotation, the types its values may have). Metrics are null where undefined (NaN).
COLUMN_TYPES = {f.name: (f.type, annotation_types(f.type, nullable=record in (Metrics, Outputs)))
                for record in SCHEMA_RECORDS for f in fields(record)}


def type_problem(row: dict) -> str | None:
    """The first schema column of ``row`` whose value has a type the record does not allow, in one line; None if
    every one fits. A bool is no number here."""
    for name, value in row.items():
        annotation, kinds = COLUMN_TYPES.get(name, ("", ()))
        if kinds and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
            return f"column {name} holds {value!r} ({type(value).__name__}) where the schema has {annotation}"
    return None


# Keys that change nothing a run computes (where it is written, how it is watched, how long it may take): a run
# resumes with them changed (both apps), and analysis compares runs without them. Dotted keys reach into a group.
FREE_KEYS = ("resume", "group", "hydra", "logger", "threads", "max_minutes", "max_wall_minutes")
# Which of a prompt set's prompts a run took: the rows name their prompts, so analysis also compares without them.
PROMPT_SELECTION_KEYS = ("num_prompts", "data.limit", "requested")


def without_keys(config: dict, keys: tuple[str, ...]) -> dict:
    """``config`` less ``keys`` (a dotted key removes one key of a group)."""
    config = {key: value for key, value in config.items() if key not in keys}
    for group, _, name in (key.partition(".") for key in keys if "." in key):
        if isinstance(config.get(group), dict):
            config[group] = {key: value for key, value in config[group].items() if key != name}
    return config


def config_difference(old: dict, new: dict, free: tuple[str, ...] = FREE_KEYS) -> str | None:
    """Every dotted key outside ``free`` where two configs differ, as 'key: old -> new', joined by ', '; None where
    they agree (the one comparison of configs: resume in both apps, and analysis)."""
    found = differences(without_keys(old, free), without_keys(new, free), "")
    return ", ".join(found) if found else None


def differences(old: dict, new: dict, prefix: str) -> list[str]:
    found = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            found.extend(differences(a, b, f"{prefix}{key}."))
        elif a != b:
            found.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return found


def json_ready(value):
    """``value`` with every non-finite float, at any depth, as None: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value


# Pooled figures: each a ratio of totals over the run's prompts, as vLLM's counters report them, so that a prompt
# counts by its tokens and its time rather than one vote each; beside them Spec-Bench's speedup, which is a ratio of
# per-question means (its evaluation/speed.py: mean tokens/s over questions, speculative over baseline). Timings are a batch's, repeated on each of its rows:
# a row adds seconds / batch_size, so the rows of a batch add the batch's seconds once. figure -> the per-row terms
# it sums, and the figure from their totals (plain numbers or numpy arrays of bootstrap totals).
POOLED_FIGURES = {
    "speedup": (("baseline_seconds", "baseline_emitted", "spec_seconds", "emitted"),
                lambda t: divide(t["baseline_seconds"] * t["emitted"], t["baseline_emitted"] * t["spec_seconds"])),
    "acceptance_rate": (("accepted", "drafted"), lambda t: divide(t["accepted"], t["drafted"])),
    "mean_accepted_length": (("emitted", "target_calls"), lambda t: divide(t["emitted"], t["target_calls"])),
    "vllm_acceptance_length": (("accepted", "drafting_calls"), lambda t: 1 + divide(t["accepted"], t["drafting_calls"])),
    "spec_bench_speedup": (("spec_tokens_per_s", "baseline_tokens_per_s"),
                           lambda t: divide(t["spec_tokens_per_s"], t["baseline_tokens_per_s"])),
    "spec_tokens_per_s": (("emitted", "spec_seconds"), lambda t: divide(t["emitted"], t["spec_seconds"])),
    "baseline_tokens_per_s": (("baseline_emitted", "baseline_seconds"),
                              lambda t: divide(t["baseline_emitted"], t["baseline_seconds"])),
}
POOLED_DEFINITIONS = {
    "speedup": "total baseline seconds per baseline token / total speculative seconds per emitted token (total "
               "time over total time where both runs emit the same tokens)",
    "acceptance_rate": "total accepted / total drafted",
    "mean_accepted_length": "total emitted / total target calls (tau)",
    "vllm_acceptance_length": "1 + total accepted / total target calls that verified drafts (vLLM's mean acceptance "
                              "length; tau over the calls that drafted, so a head's draftless first call is left out)",
    "spec_bench_speedup": "mean over prompts (and rounds) of speculative tokens/s / the same mean of baseline tokens/s "
                          "(Spec-Bench's evaluation/speed.py; every prompt one vote, the short ones included)",
    "spec_tokens_per_s": "total emitted / total speculative seconds",
    "baseline_tokens_per_s": "total baseline tokens / total baseline seconds",
}
BOOTSTRAP_SAMPLES = 2000  # resamples of the prompts (and of each prompt's rounds) for a pooled figure's interval
BOOTSTRAP_SEED = 0  # the same rows give the same interval
# Per-prompt means of these metrics leave out prompts too short to time (``too_short``): a prompt that ended in its
# first step measured a prefill, not decoding, and its ratio would swing the mean.
TIMED_METRICS = ("speedup", "spec_tokens_per_s", "baseline_tokens_per_s", "cost_ratio", "predicted_speedup")
SHORT_RULE = ("the speculative run ended within its first target call (so no decode step was timed), or the "
              "baseline emitted fewer than 2 tokens")


def divide(numerator, denominator):
    """numerator / denominator, NaN where the denominator is 0: for numbers and numpy arrays alike."""
    import numpy as np

    numerator, denominator = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    quotient = np.divide(numerator, denominator, out=np.full(np.broadcast(numerator, denominator).shape, math.nan),
                         where=denominator != 0)
    return float(quotient) if quotient.ndim == 0 else quotient


def too_short(row: dict) -> bool:
    """Whether a prompt is too short to time (``SHORT_RULE``)."""
    calls, baseline = row.get("target_calls"), row.get("baseline_emitted")
    return (is_number(calls) and calls < 2) or (is_number(baseline) and baseline < 2)


def is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def row_terms(row: dict) -> dict[str, float]:
    """What a row adds to the pooled totals: its counts, and each run's seconds as its share of its batch's; NaN
    where the row has no such number."""
    share = row.get("batch_size") if is_number(row.get("batch_size")) and row.get("batch_size") > 0 else 1

    def term(name: str, divisor: float = 1) -> float:
        value = row.get(name)
        return value / divisor if is_number(value) else math.nan

    histogram = row.get("accepted_histogram")
    drafting = sum(histogram) if isinstance(histogram, list) and all(map(is_number, histogram)) else math.nan
    return {"accepted": term("accepted"), "drafted": term("drafted"), "emitted": term("emitted"),
            "target_calls": term("target_calls"), "baseline_emitted": term("baseline_emitted"),
            "spec_seconds": term("spec_seconds", share), "baseline_seconds": term("baseline_seconds", share),
            "drafting_calls": drafting, "spec_tokens_per_s": term("spec_tokens_per_s"),
            "baseline_tokens_per_s": term("baseline_tokens_per_s")}


def bootstrap_totals(values, clusters=None):
    """[BOOTSTRAP_SAMPLES, m] column totals of ``values`` [n, m] over resamples of its n rows with replacement; where
    ``clusters`` [n] (each row's batch of prompts, ``batch_of``) repeats one (batches of several prompts, rounds,
    seeds), over resamples of the clusters and then of each drawn cluster's rows (``clustered_bootstrap_totals``).

    Each resample's totals are its row counts times ``values`` (one matrix product), drawn a few resamples at a time
    so that memory stays near 32 MB however many prompts there are."""
    import numpy as np

    if clusters is not None and len(set(clusters)) < len(clusters):
        return clustered_bootstrap_totals(values, clusters)
    n = len(values)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    chunk = max(1, 2**22 // n)  # resamples per draw: about 4M indices
    totals = []
    for start in range(0, BOOTSTRAP_SAMPLES, chunk):
        resamples = min(chunk, BOOTSTRAP_SAMPLES - start)
        drawn = rng.integers(0, n, (resamples, n), dtype=np.int32)  # int32: draws 4x faster than int64
        index = drawn + n * np.arange(resamples, dtype=np.int32)[:, None]  # [resamples, n]: at most 2**22 + n
        counts = np.bincount(index.ravel(), minlength=resamples * n).reshape(resamples, n)  # [resamples, n]
        totals.append(counts.astype(float) @ values)  # [resamples, m]; a float product is BLAS's, 1.4x faster
    return np.concatenate(totals)


def clustered_bootstrap_totals(values, prompts):
    """[BOOTSTRAP_SAMPLES, m] column totals of ``values`` [n, m] over a two-stage resample: the clusters in
    ``prompts`` (prompts, or batches of them) with replacement, then, for each one drawn, its rows (a batch's
    prompts, its rounds, its seeds' runs) with replacement. Both the cluster-to-cluster and the round-to-round
    variation reach the interval."""
    import numpy as np

    rng = np.random.default_rng(BOOTSTRAP_SEED)
    labels, cluster = np.unique(np.asarray(prompts), return_inverse=True)  # [n] each row's prompt, 0..P-1
    num_prompts = len(labels)
    drawn = rng.integers(0, num_prompts, (BOOTSTRAP_SAMPLES, num_prompts))  # [samples, P]
    prompt_counts = np.stack([np.bincount(row, minlength=num_prompts) for row in drawn])  # [samples, P]
    totals = np.zeros((BOOTSTRAP_SAMPLES, values.shape[1]))
    for p in range(num_prompts):
        members = np.flatnonzero(cluster == p)  # its rows
        within = rng.multinomial(len(members), np.full(len(members), 1 / len(members)), BOOTSTRAP_SAMPLES)
        totals += (prompt_counts[:, p : p + 1] * within) @ values[members]  # [samples, m]
    return totals


def interval(samples, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of the finite bootstrap samples."""
    import numpy as np

    finite = samples[np.isfinite(samples)]
    if not finite.size:
        return math.nan, math.nan
    low, high = np.percentile(finite, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def pooled_figure(rows: list[dict], figure: str) -> dict:
    """One pooled figure (``POOLED_FIGURES``) over the rows holding all its terms: its value, a 95% percentile
    bootstrap interval over batches of prompts and their rounds (NaN with fewer than ``MIN_PROMPTS_FOR_INTERVAL``
    rows) and the rows it rests on (``prompts``: one per prompt and round)."""
    return pooled_figure_of_terms([row_terms(row) for row in rows], figure, [batch_of(row) for row in rows])


def batch_of(row: dict) -> str:
    """Which batch of prompts a row was decoded in, whatever its round or run: the rows of one batch share their
    calls' timings, so they are one unit of the bootstrap (resampled as independent rows, 16 rows of 8 calls made
    the interval of a batch-16 speedup about 4 times too narrow). A row without a ``batch_hash`` is its prompt's."""
    digest = row.get("batch_hash")
    return digest if isinstance(digest, str) and digest else prompt_of(row)


def prompt_of(row: dict) -> str:
    """Which prompt a row decoded, whatever its round or run: its hash, else its id."""
    digest = row.get("prompt_hash")
    return digest if isinstance(digest, str) and digest else f"id:{row.get('prompt_id')}"


def pooled_figure_of_terms(terms_of_rows: list[dict], figure: str, batches: list[str] | None = None) -> dict:
    """``pooled_figure`` from each row's ``row_terms`` (and its batch, ``batch_of``), computed once for all
    figures."""
    import numpy as np

    names, formula = POOLED_FIGURES[figure]
    terms = np.array([[row[name] for name in names] for row in terms_of_rows], dtype=float).reshape(-1, len(names))
    kept = np.isfinite(terms).all(axis=1)  # [n]
    terms = terms[kept]  # [n, terms]
    n = len(terms)
    value = formula(dict(zip(names, terms.sum(axis=0)))) if n else math.nan
    low = high = math.nan
    if n >= MIN_PROMPTS_FOR_INTERVAL:
        clusters = None if batches is None else [batch for batch, keep in zip(batches, kept) if keep]
        totals = bootstrap_totals(terms, clusters)  # [samples, terms]
        low, high = interval(formula(dict(zip(names, totals.T))))
    return {"value": value, "ci_low": low, "ci_high": high, "prompts": n}


def pooled_per_position(rows: list[dict]) -> list[dict]:
    """Per draft position i: a_i = total accepted at i / total verified at i, its bootstrap interval over prompts,
    and the count it rests on (``attempts``). Rows without the counts (written before they existed) add nothing."""
    import numpy as np

    counted = [(row["per_position_accepted"], row["per_position_attempts"]) for row in rows
               if isinstance(row.get("per_position_accepted"), list)
               and isinstance(row.get("per_position_attempts"), list)]
    width = max((len(attempts) for _, attempts in counted), default=0)
    if not width:
        return []
    accepted = np.zeros((len(counted), width))  # [n, k]
    attempts = np.zeros((len(counted), width))  # [n, k]
    for i, (kept, tried) in enumerate(counted):
        accepted[i, : len(kept)], attempts[i, : len(tried)] = kept, tried
    values = divide(accepted.sum(0), attempts.sum(0))  # [k]
    bounds = np.full((2, width), math.nan)
    if len(counted) >= MIN_PROMPTS_FOR_INTERVAL:
        totals = bootstrap_totals(np.concatenate([accepted, attempts], axis=1))  # [samples, 2k]
        samples = divide(totals[:, :width], totals[:, width:])  # [samples, k]
        bounds = np.array([interval(samples[:, i]) for i in range(width)]).T
    return [{"value": float(values[i]), "ci_low": float(bounds[0, i]), "ci_high": float(bounds[1, i]),
             "attempts": int(attempts[:, i].sum())} for i in range(width)]


def summed_histogram(rows: list[dict], name: str = "accepted_histogram") -> list[int]:
    """The rows' histograms in column ``name`` (the accepted histogram h_j, j = 0..k, by default) summed entry by
    entry; rows without one add nothing."""
    lists = [row[name] for row in rows if isinstance(row.get(name), list)]
    width = max(map(len, lists), default=0)
    return [int(sum(h[j] for h in lists if j < len(h) and is_number(h[j]))) for j in range(width)]


def step_seconds(rows: list[dict]) -> dict:
    """A cost-modelling policy's mean modelled and measured seconds per decode step over the rows that have them
    (each batch's value once per row, so batches weigh by their rows); NaN where none has."""
    pairs = [(row["modelled_step_seconds"], row["measured_step_seconds"]) for row in rows
             if is_number(row.get("modelled_step_seconds")) and is_number(row.get("measured_step_seconds"))]
    if not pairs:
        return {"modelled": math.nan, "measured": math.nan}
    return {"modelled": math.fsum(m for m, _ in pairs) / len(pairs),
            "measured": math.fsum(t for _, t in pairs) / len(pairs)}


def pooled(rows: list[dict]) -> dict:
    """The run's pooled figures (``POOLED_FIGURES``), each with its interval, per-position acceptance pooled with
    its counts, the summed accepted histogram and k histogram (steps by the k drafted), a cost-modelling policy's
    modelled and measured seconds per step, and the totals they rest on."""
    terms_of_rows, batches = [row_terms(row) for row in rows], [batch_of(row) for row in rows]
    totals = {name: math.fsum(finite_values(terms[name] for terms in terms_of_rows))
              for name in ("emitted", "baseline_emitted", "spec_seconds", "baseline_seconds")}
    return {**{figure: pooled_figure_of_terms(terms_of_rows, figure, batches) for figure in POOLED_FIGURES},
            "predicted_speedup": pooled_predicted_speedup(rows),
            "per_position_acceptance": pooled_per_position(rows), "accepted_histogram": summed_histogram(rows),
            "k_histogram": summed_histogram(rows, "k_histogram"), "step_seconds": step_seconds(rows),
            "emitted": int(totals["emitted"]), "baseline_emitted": int(totals["baseline_emitted"]),
            "spec_seconds": totals["spec_seconds"], "baseline_seconds": totals["baseline_seconds"]}


def per_prompt_means(rows: list[dict]) -> dict:
    """Per metric of ``INTERVAL_METRICS``: mean and 95% t interval over prompts, and ``n`` the prompts with a
    value; a timed metric (``TIMED_METRICS``) leaves out the prompts too short to time."""
    timed = [row for row in rows if not too_short(row)]
    means = {}
    for name in INTERVAL_METRICS:
        values = finite_values(row.get(name) for row in (timed if name in TIMED_METRICS else rows))
        mean, low, high = confidence_interval(values, metric=name)
        means[name] = {"mean": mean, "ci_low": low, "ci_high": high, "n": len(values)}
    return means


def summarize_rows(rows: list[dict]) -> dict:
    """A run's summary (summary.json, the console table, W&B's run summary): per-prompt means (``metrics``), the
    pooled figures (``pooled``), each pooled figure over each round apart (``between_rounds``: the run-to-run
    spread an interval over one round's prompts leaves out), the greedy repeats whose counts disagree, and the
    prompts too short to time, counted and named (``short_prompts``). ``rows`` are one per prompt and round
    (``read_rows`` keeps one)."""
    short = [str(row.get("prompt_id")) for row in rows if too_short(row)]
    return {"prompts": len({prompt_of(row) for row in rows}), "rows": len(rows), "metrics": per_prompt_means(rows),
            "pooled": pooled(rows), "between_rounds": replicate_spread(rows, round_of),
            "greedy_repeats_disagree": disagreeing_repeats(rows),
            "short_prompts": {"count": len(short), "prompt_ids": short, "rule": SHORT_RULE}}


def round_of(row: dict) -> int:
    value = row.get("round")
    return value if is_number(value) else 0


def replicate_spread(rows: list[dict], replicate_of) -> dict:
    """Each pooled figure (``POOLED_FIGURES``) over each replicate's rows apart (a round; in analysis/ also a seed's
    run): ``replicates`` how many, and per figure its ``values`` (in replicate order), ``min``, ``max`` and ``sd``
    (the sample standard deviation; null with one replicate). With one replicate the values are the pooled ones."""
    groups: dict = {}
    for row in rows:
        groups.setdefault(replicate_of(row), []).append(row)
    order = sorted(groups, key=str)
    spread = {"replicates": len(order)}
    for figure in POOLED_FIGURES:
        values = [value_of_terms([row_terms(row) for row in groups[key]], figure) for key in order]
        finite = finite_values(values)
        mean = math.fsum(finite) / len(finite) if finite else math.nan
        sd = math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / (len(finite) - 1)) if len(finite) > 1 else math.nan
        spread[figure] = {"values": values, "min": min(finite, default=math.nan),
                          "max": max(finite, default=math.nan), "sd": sd}
    return spread


def value_of_terms(terms_of_rows: list[dict], figure: str) -> float:
    """A pooled figure's value alone (no interval) from each row's ``row_terms``."""
    names, formula = POOLED_FIGURES[figure]
    sums = {name: math.fsum(v for v in (terms[name] for terms in terms_of_rows
                                        if all(math.isfinite(terms[n]) for n in names))) for name in names}
    usable = any(all(math.isfinite(terms[n]) for n in names) for terms in terms_of_rows)
    return formula(sums) if usable else math.nan


# The counts that, at temperature 0, only other code or other weights can change.
REPEATED_COUNTS = ("emitted", "drafted", "accepted", "target_calls")


def disagreeing_repeats(rows: list[dict]) -> list[str]:
    """The prompts whose greedy (temperature 0) repeats (rounds; in analysis/ also seeds' runs) disagree in their
    counts (``REPEATED_COUNTS``): a greedy decode is deterministic, so only different code or weights, or a
    nondeterministic kernel, can cause it. Their ids, in row order."""
    seen: dict[str, tuple] = {}
    named: dict[str, str] = {}
    disagreeing: dict[str, None] = {}
    for row in rows:
        if row.get("temperature") != 0:
            continue
        key, counts = prompt_of(row), tuple(row.get(name) for name in REPEATED_COUNTS)
        named.setdefault(key, str(row.get("prompt_id")))
        if seen.setdefault(key, counts) != counts:
            disagreeing[named[key]] = None
    return list(disagreeing)


def leviathan_speedup(alpha: float, k: float, cost_ratio: float) -> float:
    """Leviathan et al. (2023) eq. 1 for a mean draft length k (any real k >= 0):
    (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)), and (k + 1) / (k c + 1) at alpha = 1; NaN where an input is
    undefined or out of range (a hand-edited row)."""
    if not all(map(is_number, (alpha, k, cost_ratio))) or not 0 <= alpha <= 1 or k < 0 or cost_ratio < 0:
        return math.nan
    tokens = k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * cost_ratio + 1)


def pooled_predicted_speedup(rows: list[dict]) -> dict:
    """The run's one predicted speedup (``leviathan_speedup``): alpha the pooled acceptance rate, k the drafts per
    step that drafted (total drafted / total steps that drafted: what the steps drafted, not the configured k), c
    the mean cost ratio over the prompts timed. NaN where no row has a prediction of its own (a tree's rows have
    none: the formula is for chains). No interval: a model's figure, not a measurement's."""
    terms = [row_terms(row) for row in rows]
    for row, t in zip(rows, terms):  # a row written before the histogram: its steps drafted the configured k
        if not math.isfinite(t["drafting_calls"]) and is_number(row.get("k")) and row["k"] > 0:
            t["drafting_calls"] = t["drafted"] / row["k"]
    counted = [t for t in terms if math.isfinite(t["drafted"]) and math.isfinite(t["drafting_calls"])]
    drafted, steps = math.fsum(t["drafted"] for t in counted), math.fsum(t["drafting_calls"] for t in counted)
    costs = finite_values(row.get("cost_ratio") for row in rows if not too_short(row))
    value = math.nan
    if any(is_number(row.get("predicted_speedup")) for row in rows) and steps and costs:
        value = leviathan_speedup(value_of_terms(terms, "acceptance_rate"), drafted / steps,
                                  math.fsum(costs) / len(costs))
    return {"value": value, "ci_low": math.nan, "ci_high": math.nan, "prompts": len(rows),
            "drafted_k": drafted / steps if steps else math.nan}


def confidence_interval(values, level: float = 0.95, metric: str | None = None) -> tuple[float, float, float]:
    """(mean, low, high): mean ± t_{(1+level)/2, n-1} · s / sqrt(n) over the finite values (None and NaN are
    skipped), clipped to the metric's range (``METRIC_RANGES``); NaN bounds with fewer than
    ``MIN_PROMPTS_FOR_INTERVAL`` values, NaN throughout with none."""
    x = finite_values(values)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = math.fsum(v / n for v in x)  # each term divided first: values near float's maximum sum without overflow
    if n < MIN_PROMPTS_FOR_INTERVAL:
        return mean, math.nan, math.nan
    from scipy.stats import t  # here, so that importing the schema costs nothing

    deviation = math.sqrt(math.fsum((v - mean) * (v - mean) for v in x) / (n - 1))  # inf past float's range
    half = float(t.ppf((1 + level) / 2, n - 1)) * deviation / math.sqrt(n)
    lowest, highest = METRIC_RANGES.get(metric, (-math.inf, math.inf))
    # The interval holds its mean even where damaged rows put the mean outside the range (a speedup of -1).
    return mean, max(mean - half, min(lowest, mean)), min(mean + half, max(highest, mean))


def finite_values(values) -> list[float]:
    """The values that are finite numbers, as floats (JSON writes an undefined metric as null; a damaged row may
    hold anything)."""
    floats = (float(v) for v in values if isinstance(v, numbers.Real) and not isinstance(v, bool))
    return [v for v in floats if math.isfinite(v)]


# Reading ------------------------------------------------------------------------------------------------------------

class Read(NamedTuple):
    """What a reader found: the value (None when the file is absent or unreadable) and, when it could not read
    the file, one line saying why (None otherwise)."""

    value: object
    problem: str | None


def read_bytes(path: Path) -> Read:
    """The bytes of a file; an absent file is Read(None, None), one that cannot be read says why."""
    try:
        return Read(Path(path).read_bytes(), None)
    except FileNotFoundError:
        return Read(None, None)
    except IsADirectoryError:
        return Read(None, f"{path} is a directory, not a file")
    except OSError as err:
        return Read(None, f"{path} cannot be read ({err.strerror or err})")


def read_config(run_dir: Path) -> Read:
    """config.yaml as a mapping. Empty (cut short by a kill in an older version, which wrote it in place),
    binary, not YAML, or not a mapping: a problem."""
    import yaml

    path = Path(run_dir) / CONFIG
    data, problem = read_bytes(path)
    if data is None:
        return Read(None, problem)
    if not data.strip():
        return Read(None, f"{path} is empty (cut short while it was written)")
    try:
        value = yaml.safe_load(data.decode("utf-8"))
    except UnicodeDecodeError:
        return Read(None, f"{path} is not UTF-8 text (binary or damaged)")
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as err:
        return Read(None, f"{path} is not valid YAML ({first_line(err)}): cut short or damaged")
    if not isinstance(value, dict):
        return Read(None, f"{path} holds a {type(value).__name__}, not a mapping of settings")
    return Read(value, None)


def read_json_object(path: Path) -> Read:
    """A JSON object file (summary.json, failure.json, run.lock); anything else says what it is."""
    data, problem = read_bytes(path)
    if data is None:
        return Read(None, problem)
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        return Read(None, f"{path} is not UTF-8 text (binary or damaged)")
    except (ValueError, RecursionError) as err:
        return Read(None, f"{path} is not valid JSON ({first_line(err)}): cut short or damaged")
    if not isinstance(value, dict):
        return Read(None, f"{path} holds a {type(value).__name__}, not a JSON object")
    return Read(value, None)


def read_summary(run_dir: Path) -> Read:
    return read_json_object(Path(run_dir) / SUMMARY)


def read_failure(run_dir: Path) -> Read:
    """failure.json: an object with a string ``error`` and an integer ``exit_code``."""
    path = Path(run_dir) / FAILURE
    failure, problem = read_json_object(path)
    if failure is None:
        return Read(None, problem)
    code = failure.get("exit_code")
    if not isinstance(failure.get("error"), str) or isinstance(code, bool) or not isinstance(code, int):
        return Read(None, f"{path} lacks a string 'error' and an integer 'exit_code'")
    return Read(failure, None)


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# Why a piece of rows.jsonl is not kept as a row, as the one-line reports count them ("2 duplicate row(s)").
UNREADABLE = "unreadable line piece(s)"  # not UTF-8, or not a JSON object
NOT_A_ROW = "object(s) without run_id or prompt_id"
OTHER_RUN = "row(s) of another run"
DUPLICATE = "duplicate row(s)"
STALE = "row(s) of prompts no longer in the prompt set"  # resume's judgement: only it knows the prompt set
INCONSISTENT = "row(s) whose columns disagree"  # resume's: tokens vs emitted, prompt_id vs the prompt's hash


@dataclass(frozen=True)
class Piece:
    """A piece of rows.jsonl that is not a row to keep: where it was, its bytes, and why (one of the labels
    above)."""

    line: int
    raw: bytes
    reason: str


@dataclass(frozen=True)
class RowsRead:
    """rows.jsonl as read: the rows to keep, in file order, and the pieces left out. ``problem``: the file itself
    could not be read (a directory, no permission), so there are no rows."""

    rows: list[dict]
    set_aside: list[Piece]
    problem: str | None = None
    last_line: int = 0  # the number of the file's last line that is not blank


def read_rows_file(run_dir: Path) -> RowsRead:
    """The rows of a run directory, one per prompt, as resume and analysis/ both read them.

    Every JSON object that parses is a candidate, also two rows merged on one line (a row that lost its newline).
    Kept: objects with a string ``run_id`` and a ``prompt_id`` (an integer one, as a hand edit leaves it, becomes
    its string), of the run of the first such row, once per prompt (``prompt_key``), the first written. Everything
    else is a ``Piece``: lines that are not UTF-8, pieces that are not JSON objects, objects that are not rows,
    rows of another run, and duplicates. No rows.jsonl: no rows.
    """
    path = Path(run_dir) / ROWS
    data, problem = read_bytes(path)
    if data is None:
        return RowsRead([], [], problem)
    candidates, pieces = parse_rows(data)
    last_line = max((number for number, line in enumerate(data.split(b"\n"), 1) if line.strip()), default=0)
    rows, seen, run_id = [], set(), None
    for line, row in candidates:
        if not is_row(row):
            pieces.append(Piece(line, dump(row), NOT_A_ROW))
            continue
        row = {**row, "prompt_id": str(row["prompt_id"])}
        run_id = run_id or row["run_id"]
        if row["run_id"] != run_id:
            pieces.append(Piece(line, dump(row), OTHER_RUN))
        elif prompt_key(row) in seen:
            pieces.append(Piece(line, dump(row), DUPLICATE))
        else:
            seen.add(prompt_key(row))
            rows.append(row)
    return RowsRead(rows, sorted(pieces, key=lambda piece: piece.line), last_line=last_line)


def read_rows(run_dir: Path) -> list[dict]:
    """The rows ``read_rows_file`` keeps (none if there is no rows.jsonl yet)."""
    return read_rows_file(run_dir).rows


def is_row(value: object) -> bool:
    if not isinstance(value, dict):
        return False
    run_id, prompt_id = value.get("run_id"), value.get("prompt_id")
    return (isinstance(run_id, str) and bool(run_id) and not isinstance(prompt_id, bool)
            and isinstance(prompt_id, (str, int)) and str(prompt_id) != "")


def prompt_key(row: dict) -> tuple[str, str, int]:
    """Which prompt and round a row decoded: its ``prompt_hash`` (its ``prompt_id`` for a row written before rows
    carried one) and its ``round`` (0 for a row written before rounds existed)."""
    digest = row.get("prompt_hash")
    prompt = ("hash", digest) if isinstance(digest, str) and digest else ("id", str(row["prompt_id"]))
    return (*prompt, round_of(row))


def dump(row: object) -> bytes:
    return json.dumps(row).encode("utf-8")


def parse_rows(data: bytes) -> tuple[list[tuple[int, object]], list[Piece]]:
    """Every JSON value in rows.jsonl bytes with its line number (two merged on one line included), and each piece
    that is not one (a line that is not UTF-8 is one piece)."""
    values, pieces = [], []
    for number, line in enumerate(data.split(b"\n"), 1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            pieces.append(Piece(number, line, UNREADABLE))
            continue
        line_values, unparsed = parse_line(text)
        values += [(number, value) for value in line_values]
        pieces += [Piece(number, piece.encode("utf-8"), UNREADABLE) for piece in unparsed]
    return values, pieces


ROW_START = re.compile(r'\{\s*"')  # where a JSON object with a first key can begin
SPACE = re.compile(r"\s*")


def parse_line(line: str) -> tuple[list[dict], list[str]]:
    """The JSON objects on one line of rows.jsonl, and the pieces of it that are not one. A line can hold more than
    one row: a row that lost its newline had the next one appended to it. After a piece that does not parse,
    parsing resumes at the next '{"' (where a row can begin), so a torn row never takes an intact one with it, and
    what does not parse between two rows is one piece (a megabyte of "{" is one piece, tried once)."""
    decoder, rows, unparsed, text = json.JSONDecoder(), [], [], line.strip()
    position, torn_from = 0, None  # torn_from: where the piece that does not parse began
    while position < len(text):
        try:
            row, end = decoder.raw_decode(text, position)
            if not isinstance(row, dict):
                raise ValueError("a row is a JSON object")
        except (ValueError, RecursionError):
            torn_from = position if torn_from is None else torn_from
            following = ROW_START.search(text, position + 1)
            position = following.start() if following else len(text)
            continue
        if torn_from is not None:
            unparsed.append(text[torn_from:position].strip())
            torn_from = None
        rows.append(row)
        position = SPACE.match(text, end).end()  # not text[end:].lstrip(): a copy of the rest per row is quadratic
    if torn_from is not None:
        unparsed.append(text[torn_from:].strip())
    return rows, unparsed


def describe_pieces(pieces: list[Piece]) -> str:
    """'2 unreadable line piece(s), 1 duplicate row(s)': the pieces counted by reason, in a fixed order."""
    order = (UNREADABLE, NOT_A_ROW, OTHER_RUN, DUPLICATE, STALE, INCONSISTENT)
    counts = {reason: sum(piece.reason == reason for piece in pieces) for reason in order}
    return ", ".join(f"{count} {reason}" for reason, count in counts.items() if count)


# Documentation and tables -------------------------------------------------------------------------------------------

def schema_tables() -> str:
    """The column tables of docs/results-schema.md, one per record: column, Python type (None and NaN are JSON
    null), meaning."""
    sections = []
    for record in SCHEMA_RECORDS:
        body = [[f.name, f.type, f.metadata["meaning"]] for f in fields(record)]
        title = " ".join(record.__doc__.split())
        sections.append(f"### `{record.__name__}`\n\n{title}\n\n"
                        + markdown_table(["column", "type", "meaning"], body))
    return "\n\n".join(sections) + "\n"


def markdown_table(header: list, rows: list[list]) -> str:
    """A GitHub Markdown table, each cell as ``str(cell)`` with "|" escaped; no trailing newline. The benches and
    analysis/ both write theirs with it, each formatting its numbers first."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(cell).replace("|", r"\|") for cell in line) + " |" for line in lines)
