"""The GPU suite's time-budget scheduler: each section gets a share of the suite's budget (time a section leaves
unused goes to the next), each item inside it is estimated (the longest of its kind so far, else a first guess) and
skipped with a line saying so when it does not fit; an item or a section that fails is recorded and the suite goes
on; the files are written again after every item (``Suite.checkpoint``)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from experiments.gpu.models import load_models
from experiments.gpu.plan import HEADLINE_KEYS, SuitePlan
from experiments.harness import Report, markdown
from specdec.costs import CostModel
from specdec import Clock
from specdec.models import ModelPair

# --- budgets ------------------------------------------------------------------------------------------------------


class Budget:
    """The seconds one section may spend, on ``now``'s clock, and the lines of what it skipped or what failed."""

    def __init__(self, seconds: float, now: Callable[[], float]):
        self.now, self.deadline, self.skipped, self.failed = now, now() + seconds, [], []

    def left(self) -> float:
        return self.deadline - self.now()

    def allows(self, what: str, estimate: float) -> bool:
        """Whether ``what``, estimated at ``estimate`` seconds, fits what is left; if not, a line says so."""
        if estimate <= self.left():
            return True
        self.skip(what, f"needs ~{estimate:.0f} s, {max(self.left(), 0):.0f} s left in the section")
        return False

    def skip(self, what: str, why: str) -> None:
        line = f"skipped {what}: {why}"
        print(f"[gpu_suite] {line}", flush=True)
        self.skipped.append(line)


class Estimates:
    """How long an item of each kind takes: the longest one measured so far, else a first guess."""

    def __init__(self):
        self.longest: dict[str, float] = {}

    def of(self, kind: str, guess: float) -> float:
        return self.longest.get(kind, guess)

    def add(self, kind: str, seconds: float) -> None:
        self.longest[kind] = max(seconds, self.longest.get(kind, 0.0))


def section_budget(left: float, later_shares: float) -> float:
    """A section's seconds: what the suite has left less what the sections after it count on, so a section's
    unused time goes to the next."""
    return max(left - later_shares, 0.0)


# --- the suite ----------------------------------------------------------------------------------------------------


@dataclass
class SectionRecord:
    """What a section did, for the JSON and the time line."""

    seconds: float = 0.0
    budget_seconds: float = 0.0
    status: str = "started"  # then "done" or "failed"
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # items that raised (the section went on)
    error: str | None = None  # the section itself raised


class Suite:
    """One run of the suite: the plan, the models, what every item measured (``results``, ``tables``), the
    Markdown blocks shown so far (``blocks``), and whether the device step may run (``device_step_refused``: None,
    or why not)."""

    def __init__(self, plan: SuitePlan, now: Callable[[], float] = time.monotonic,
                 checkpoint: Callable[[], object] = lambda: None):
        self.plan, self.now, self.checkpoint = plan, now, checkpoint
        self.started = now()
        self.header = ""
        self.results: dict = {key: None for key in HEADLINE_KEYS}
        self.tables: dict[str, list[dict]] = {}
        self.blocks: dict[str, str] = {}  # table name -> its Markdown (heading, table, note), in first-shown order
        self.records: dict[str, SectionRecord] = {}
        self.estimates = Estimates()
        self.loaded: ModelPair | None = None
        self.clock: Clock | None = None  # the pair's device's, once it is loaded
        self.bandwidth: float | None = None  # bytes/s
        self.costs: CostModel | None = None  # the draft's step and the target's forwards, as the step runs them
        self.fastest_ar: str | None = None  # our fastest autoregressive mode at batch 1
        self.device_step_refused: str | None = None  # why the preflight failed, once it has
        self.speculative = None  # a sections.SpeculativeRun  # the speculative sections' prompts, baseline and rows

    @property
    def pair(self) -> ModelPair:
        """The plan's pair, loaded on first use (the preflight runs before it)."""
        if self.loaded is None:
            start = time.monotonic()
            self.loaded = load_models(self.plan)
            self.clock = Clock(self.loaded.target.device)
            print(f"[gpu_suite] {self.plan.pair} loaded in {time.monotonic() - start:.1f} s", flush=True)
        return self.loaded

    def left(self) -> float:
        return self.plan.budget_seconds - (self.now() - self.started)

    def run(self, sections: dict[str, Callable[[Suite, Budget], None]]) -> None:
        """Run each section in turn within its budget; a failure is recorded, and the next section runs. The files
        are written after every item (``attempt``) and every section."""
        names = list(sections)
        for index, name in enumerate(names):
            later = sum(self.plan.shares.get(later_name, 0.0) for later_name in names[index + 1:])
            record = self.records[name] = SectionRecord(budget_seconds=section_budget(self.left(), later))
            budget = Budget(record.budget_seconds, self.now)
            record.skipped, record.failed = budget.skipped, budget.failed  # the same lists: written as they grow
            start = self.now()
            try:
                sections[name](self, budget)
                record.status = "done"
            except Exception as err:  # a section's failure must not cost the others their figures
                traceback.print_exc()
                record.status, record.error = "failed", f"{type(err).__name__}: {error_line(err)}"
            record.seconds = self.now() - start
            print(time_line(name, record), flush=True)
            self.checkpoint()

    def attempt(self, budget: Budget, what: str, kind: str, guess: float, work: Callable[[], object],
                device_step: bool = False):
        """Run ``work`` if the device step may run (where it needs it) and its estimate (by ``kind``) fits the
        budget, learn its time, and write the files. None when skipped, or when it raised: the error is recorded
        and the section goes on."""
        if device_step and self.device_step_refused is not None:
            budget.skip(what, f"the preflight failed ({self.device_step_refused})")
            return None
        if not budget.allows(what, self.estimates.of(kind, guess)):
            return None
        start = self.now()
        try:
            value = work()
        except Exception as err:  # one method's failure (a compile that breaks, say) must not cost the others
            traceback.print_exc()
            budget.failed.append(f"{what}: {type(err).__name__}: {error_line(err)}")
            value = None
        else:
            self.estimates.add(kind, self.now() - start)
        self.checkpoint()
        return value

    def first_call_guess(self, compiled: bool) -> float:
        return self.plan.first_call_guess["compiled" if compiled else "eager"]

    def show(self, name: str, heading: str, rows: list[dict], note: str = "", echo: bool = True) -> None:
        """A table's Markdown block (written with the files; replaced when shown again), printed if ``echo``."""
        block = f"{heading}\n\n{markdown(rows)}" + (f"\n\n{note}" if note else "")
        self.blocks[name] = block
        if echo:
            print(block, flush=True)

    def payload(self) -> dict:
        """The JSON: headline keys first, then the plan, the sections' records and every table's rows."""
        return {**self.results, "plan": asdict(self.plan), "sections": {name: asdict(record) for name, record
                                                                        in self.records.items()},
                "tables": self.tables}

    def markdown(self) -> str:
        """The header, every table shown so far, the failed sections, the headline and the time lines."""
        failures = [f"**Section `{name}` failed**: {record.error}" for name, record in self.records.items()
                    if record.error]
        report = Report()
        report.sections = [self.header, *self.blocks.values(), *failures, headline_table(self), sections_table(self)]
        return report.text()


def time_line(name: str, record: SectionRecord) -> str:
    skipped = f", {len(record.skipped)} item(s) skipped" if record.skipped else ""
    failed = f", {len(record.failed)} item(s) failed" if record.failed else ""
    return (f"[gpu_suite] section {name}: {record.status} in {record.seconds:.1f} s "
            f"(budget {record.budget_seconds:.0f} s{skipped}{failed})")


def error_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def headline_table(suite: Suite) -> str:
    rows = [{"key": key, "value": suite.results.get(key)} for key in (*HEADLINE_KEYS, "spec_a07_best_over_hf_best_ar",
                                                                      "host_reads_per_step", "study_ok")]
    fastest = f"; our fastest autoregressive mode at batch 1: `{suite.fastest_ar}`" if suite.fastest_ar else ""
    return (f"## Headline figures (null: not measured)\n\n{markdown(rows)}\n\n(Targets in issues 24 and 36"
            f"{fastest}.)")


def sections_table(suite: Suite) -> str:
    rows = [{"section": name, "status": record.status, "seconds": round(record.seconds, 1),
             "budget_seconds": round(record.budget_seconds), "skipped": "; ".join(record.skipped),
             "failed": "; ".join(record.failed), "error": record.error or ""} for name, record in suite.records.items()]
    return f"## Sections (time lines)\n\n{markdown(rows)}" if rows else "## Sections\n\nnone run"
