"""Drafting across tokenizers: a draft model with its own vocabulary proposes *target* tokens (issue 27).

The draft keeps its own context in its own tokens, in its own cache, and hands the loop target token ids; the
token bridge (``specdec.token_bridge``) moves text between the two vocabularies. What each temperature does:

- **Temperature 0 (text).** The draft drafts greedily in rounds of about ``k * ratio + 1`` draft tokens (ratio:
  the rows' draft tokens per target token so far); the drafted text becomes target tokens as the target tokenizer
  encodes it (``TokenBridge.to_target``), until every row has k of them, drafted its EOS, or ``max_rounds`` ran.
  The first k are proposed; rows with fewer are padded (with the target's EOS, or 0). The target judges every
  proposed token by greedy matching, so the output is the target's greedy output whatever is proposed: a pad or a
  poor guess costs speed only.
- **Temperature > 0 (token-level intersection, TLI).** Each draft step applies the sampling settings to the draft
  logits and restricts the result to the tokens both vocabularies spell the same (``TokenBridge.restrict``):
  q'. A target token x ~ q' is proposed with q', and the draft is fed the draft token of the same text. The
  speculative rule judges x against q', the distribution it was drawn from: exact. A row whose q' has no mass
  (the draft's filtered distribution lies wholly on tokens the target lacks) proposes a point mass at the shared
  token with the highest draft logit, a deterministic choice given the history: the rule is exact on point
  masses too. Drafts are one target token per draft forward, with no host read until the verdict.
  The loop's stop hook (EOS, a policy that ``stops_drafts``) is asked after each drafted target token here;
  the temperature-0 rounds ignore it (the draft's EOS ends a row's text there).
- **The same tokenizer on both sides** (same vocabulary and special tokens, same logit width;
  ``translate="auto"``): ids mean the same on both sides, so this is exactly a ``ModelDrafter`` (every token,
  EOS and byte fragments included, at any temperature; its device step too). ``translate="text"`` forces the
  text path anyway, to measure what the conversion costs.

After each verdict (``commit``) every generating row adds its emitted target tokens, takes their whole-character
text (``TokenBridge.target_text``) and re-encodes it after its draft context over a look-behind window
(``TokenBridge.resync``): its draft context stays the draft tokenizer's own encoding of the committed text, and the
drafted tokens the text kept stay in the cache. Host state per row (``TextRows``): the committed target tokens,
how many of them spell whole characters, the draft context, and how much of it the cache holds.

The cache. The re-encoding can rewrite a context's last tokens ("Hello wor" + "ld" is " world" where " wor" was),
but a cache rolls back only what it was fed this step. So each row's last ``hold_back`` draft tokens are never
kept: they are queued again and fed with the next step's first forward, where a rewrite replaces them freely. A
rewrite reaching further back (rare with 2: no case in 1,450 commits of held-out text between GPT-2's BPE and
the embedded pair's) rebuilds the draft cache from every row's context in one prefill (``ConversionStats
.rebuilds``). So does a draft context that would outgrow the draft model's positions: its rows keep their last
tokens, and a step drafts at most half the positions (``fit_positions``). The draft's positions therefore bound no
row (``bounds_context`` is False): the target's context alone does.

Costs (``ConversionStats``): draft tokens per proposed target token, host seconds in the bridge (decoding and
re-encoding: tokenizers are host code, one batched call per operation), one host read per draft round at
temperature 0 and one per step in ``commit``, a draft forward of ``hold_back`` extra tokens per step, and rebuilds.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import torch

from specdec.cache import check_runner_options, context_limit, static_capacity
from specdec.checks import as_integer, check_draft_length, check_tokenizer, check_vocabulary_fits, model_device
from specdec.context import CachedContext
from specdec.drafters import DRAFT_ROOM_GUESS, ModelDrafter
from specdec.interfaces import StopHook
from specdec.layout import Proposal
from specdec.sampling import SamplingConfig, finite_peaks, greedy_choice, logits_to_probs, one_hot_probs, sample
from specdec.token_bridge import TokenBridge, id_range, same_tokens
from specdec.types import StepOutcome

TRANSLATIONS = ("auto", "text")
MAX_DRAFT_RATIO = 4.0  # draft rounds are sized for at most this many draft tokens per target token
OPTIONS = ("look_behind", "hold_back", "max_rounds", "translate", "label")


@dataclass
class ConversionStats:
    """What drafting across tokenizers cost in one ``generate`` call (the rows that generated)."""

    draft_tokens: int = 0  # draft tokens the draft model drafted
    target_tokens: int = 0  # target tokens proposed from them (pads excluded)
    bridge_seconds: float = 0.0  # host time in the token bridge: decoding, re-encoding, resynchronising
    rebuilds: int = 0  # draft caches rebuilt from the rows' contexts (a rewrite past the hold-back, or no room)
    no_shared_mass: int = 0  # temperature > 0: draft steps proposed as a point mass (q' had no mass)

    @property
    def draft_tokens_per_target_token(self) -> float:
        return self.draft_tokens / self.target_tokens if self.target_tokens else math.nan


@dataclass
class TextRows:
    """Each batch row's committed text in both vocabularies (host lists; see the module docstring)."""

    target_ids: list[list[int]]  # committed target tokens: the prompt's real ones, then what each step emitted
    target_synced: list[int]  # target_ids[:n] spell whole characters: the text draft_ids spell
    draft_ids: list[list[int]]  # the draft tokenizer's encoding of that text: the draft's context
    cached: list[int]  # draft_ids[:n] are in the draft cache, the rest queued (all of it: nothing queued)
    live: list[bool]  # still generating; other rows keep their state and feed holes

    def queued(self) -> list[int]:
        return [len(ids) - n for ids, n in zip(self.draft_ids, self.cached)]

    def select(self, index: list[int]) -> TextRows:
        return TextRows(*([getattr(self, name)[i] for i in index] for name in
                          ("target_ids", "target_synced", "draft_ids", "cached", "live")))


class CrossTokenizerDrafter(ModelDrafter):
    """Drafts for a target with another tokenizer (see the module docstring).

    ``target_vocab_size``: the target model's logit width (default: the target tokenizer's id range).
    ``look_behind``: committed tokens re-encoded with new text (``TokenBridge``). ``hold_back``: draft tokens per
    row fed again each step so a re-encoding can rewrite them. ``max_rounds``: draft rounds per step at
    temperature 0. ``translate``: "auto" (ids where both sides share the tokenizer) or "text" (always the text
    path). The draft runs eager on the dynamic cache layout; ``compile`` only where ids are shared.
    """

    name = "cross_tokenizer"

    @classmethod
    def from_pair(cls, pair, compile: bool = False, forward: str = "auto", **options) -> CrossTokenizerDrafter:
        cls.check_options(compile=compile, forward=forward, **options)
        return cls(pair.draft, pair.draft_tokenizer, pair.tokenizer,
                   target_vocab_size=pair.target.config.vocab_size, compile=compile, forward=forward, **options)

    @classmethod
    def reads_draft_model(cls, **options) -> bool:
        return True

    @classmethod
    def check_options(cls, compile: bool = False, forward: str = "auto", **options) -> None:
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise TypeError(f"CrossTokenizerDrafter got unknown options {sorted(unknown)}; it takes "
                            f"{', '.join(OPTIONS)}")
        check_text_options(options.get("look_behind", 10), options.get("hold_back", 2),
                           options.get("max_rounds", 3), options.get("translate", "auto"))
        check_runner_options("dynamic", forward, compile)

    def __init__(self, model: torch.nn.Module, draft_tokenizer, target_tokenizer, target_vocab_size: int | None = None,
                 look_behind: int = 10, hold_back: int = 2, max_rounds: int = 3, translate: str = "auto",
                 label: str = "draft", forward: str = "auto", compile: bool = False):
        check_text_options(look_behind, hold_back, max_rounds, translate)
        look_behind, hold_back, max_rounds = (as_integer(value) for value in (look_behind, hold_back, max_rounds))
        check_tokenizer("draft_tokenizer", draft_tokenizer)
        check_tokenizer("target_tokenizer", target_tokenizer)
        super().__init__(model, label=label, cache_layout="dynamic", forward=forward, compile=compile)
        draft_vocab_size = model.config.vocab_size
        check_vocabulary_fits("the draft model's vocab_size", draft_vocab_size, "draft tokenizer",
                              id_range(draft_tokenizer, "draft"))
        if target_vocab_size is not None:
            check_draft_length("target_vocab_size", target_vocab_size)
            check_vocabulary_fits("target_vocab_size", target_vocab_size, "target tokenizer",
                                  id_range(target_tokenizer, "target"))
        shares_ids = (translate == "auto" and same_tokens(draft_tokenizer, target_tokenizer)
                      and target_vocab_size in (None, draft_vocab_size))
        if compile and not shares_ids:
            raise ValueError("compile=True needs the same tokenizer on both sides (translate='auto'): across "
                             "tokenizers the draft's feeds change width every step, so it runs eager")
        self.hold_back, self.max_rounds = hold_back, max_rounds
        self.bridge: TokenBridge | None = None  # None: ids are shared, and this is a ModelDrafter
        if not shares_ids:
            device = next(model.parameters()).device
            self.bridge = TokenBridge(draft_tokenizer, target_tokenizer, look_behind, draft_vocab_size,
                                      target_vocab_size).to(device)
            self.draft_eos = draft_tokenizer.eos_token_id
            self.pad = target_tokenizer.eos_token_id if target_tokenizer.eos_token_id is not None else 0
            self.prefix = special_prefix(draft_tokenizer)
            self.start_token = next((i for i in (draft_tokenizer.bos_token_id, draft_tokenizer.eos_token_id)
                                     if i is not None), None)
            self.position_limit = context_limit(model)
            if self.bridge.num_shared == 0:
                warnings.warn("the draft and target tokenizers spell no token the same: at temperature > 0 (TLI) "
                              "this drafter proposes nothing, and decoding is the target's alone", stacklevel=2)
        self.stats = ConversionStats()

    @property
    def drafts_on_device(self) -> bool:
        return self.bridge is None and super().drafts_on_device

    @property
    def bounds_context(self) -> bool:
        """Across tokenizers the draft's context is its own re-encoding of the text, kept within its model's
        positions (``fit_positions``): the target's context alone bounds a row. With shared ids, as a
        ``ModelDrafter``."""
        return self.bridge is None

    def check_target(self, target: torch.nn.Module) -> None:
        """Across tokenizers its proposals (and q') span the target vocabulary the bridge was built for, which must
        be the target model's logit width; with shared ids, a ``ModelDrafter``'s check."""
        if self.bridge is None:
            super().check_target(target)
            return
        if target.config.vocab_size != self.bridge.target_vocab_size:
            raise ValueError(f"the target has vocab_size={target.config.vocab_size} but this drafter was built for "
                             f"{self.bridge.target_vocab_size} target tokens; pass "
                             f"target_vocab_size=target.config.vocab_size (from_pair does)")
        draft_device, target_device = model_device(self.model), model_device(target)
        if draft_device != target_device:
            raise ValueError(f"the {self.label} model is on {draft_device} but the target on {target_device}; put "
                             f"both on one device")

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Encode each row's prompt text for the draft and queue it whole."""
        self.stats = ConversionStats()
        if self.bridge is None:
            super().start(input_ids, attention_mask)
            return
        batch_size, width = input_ids.shape
        read = torch.cat([input_ids, attention_mask.long()], 1).tolist()  # one host read
        target_ids = [[token for token, real in zip(row[:width], row[width:]) if real] for row in read]
        started = time.perf_counter()
        spans = self.bridge.target_text(target_ids, [0] * batch_size)
        resyncs = self.bridge.resync([self.prefix] * batch_size, [len(self.prefix)] * batch_size,
                                     [span.text for span in spans])
        self.stats.bridge_seconds += time.perf_counter() - started
        draft_ids = [self.prefix[:r.keep] + r.feed for r in resyncs]
        self.rows = TextRows(target_ids, [span.end for span in spans], [self.started(row, i) for i, row in
                             enumerate(draft_ids)], [0] * batch_size, [True] * batch_size)
        self.keep_last_tokens(self.most_drafted_per_step())
        self.live = None
        self.num_forwards = 0
        self.prefill(input_ids.device)
        self.end_step(input_ids.device)

    def started(self, draft_ids: list[int], row: int) -> list[int]:
        """A row's draft context, never empty (the draft needs a token to draft from)."""
        if draft_ids:
            return draft_ids
        if self.start_token is None:
            raise ValueError(f"row {row}'s prompt has no text, and the draft tokenizer has no BOS or EOS token to "
                             f"start its context from")
        return [self.start_token]

    def prefill(self, device: torch.device) -> None:
        """A fresh draft context whose queue is every row's whole draft context (fed with the next forward)."""
        rows = self.rows
        rows.cached = [0] * len(rows.cached)
        queue, valid = left_padded(rows.draft_ids, device)
        cache = self.runner.new_cache(queue.shape[0], static_capacity(queue.shape[1], DRAFT_ROOM_GUESS), device)
        self.context = CachedContext(cache, queue, valid)
        self.needs_prefill = False

    def end_step(self, device: torch.device) -> None:
        self.drafted = torch.zeros(len(self.rows.cached), 0, dtype=torch.long, device=device)  # [B, n] draft ids
        self.num_fed = 0  # drafted tokens fed this step (all but the last)
        self.no_shared_mass = torch.zeros(1, dtype=torch.long, device=device)  # [1] point-mass steps this step

    def draft(self, k: int, sampling: SamplingConfig, generator: torch.Generator, stop: StopHook | None) -> Proposal:
        if self.bridge is None:
            return super().draft(k, sampling, generator, stop)
        if sampling.is_greedy:
            ratio = self.draft_ratio()
            most = self.most_drafted_per_step(self.max_rounds * self.round_size(k, ratio))
            self.fit_positions(most)
            return self.draft_text(k, ratio, most)
        if self.bridge.num_shared == 0:  # q' has no token to sample: propose nothing (exact, and plain decoding)
            return Proposal(self.drafted, None)
        most = self.most_drafted_per_step(k)
        self.fit_positions(most)
        return self.draft_shared(most, sampling, generator, stop)

    def most_drafted_per_step(self, wanted: int | None = None) -> int | None:
        """Draft tokens one step may draft: ``wanted`` (None: no bound), at most half the draft model's positions
        so that a context of the other half always fits before them."""
        if self.position_limit is None:
            return wanted
        half = max(self.position_limit // 2, 1)
        return half if wanted is None else min(wanted, half)

    def fit_positions(self, most_drafted: int | None) -> None:
        """Rebuild the draft cache where a commit asked for it, or where a row could outgrow the draft model's
        positions with ``most_drafted`` more tokens (it keeps its last tokens)."""
        if self.keep_last_tokens(most_drafted) or self.needs_prefill:
            self.stats.rebuilds += 1
            self.prefill(self.context.queue.device)

    def keep_last_tokens(self, most_drafted: int | None) -> bool:
        """Cut each row's draft context that would outgrow the draft model's positions with ``most_drafted`` more
        tokens to its last tokens (half the room, so a rebuild is rare); whether any was cut."""
        if self.position_limit is None:
            return False
        room, rows = self.position_limit - most_drafted, self.rows
        too_long = [i for i, ids in enumerate(rows.draft_ids) if len(ids) > room]
        for i in too_long:
            rows.draft_ids[i] = rows.draft_ids[i][-max(room // 2, 1):]
        return bool(too_long)

    def draft_ratio(self) -> float:
        """Draft tokens per target token in the live rows' committed text (their largest), at most the cap."""
        rows = self.rows
        ratio = max(len(ids) / max(synced, 1) for ids, synced, live in
                    zip(rows.draft_ids, rows.target_synced, rows.live) if live)
        return min(ratio, MAX_DRAFT_RATIO)

    @staticmethod
    def round_size(missing: int, ratio: float) -> int:
        """Draft tokens for ``missing`` target tokens; to_target leaves out the last token, whose text could grow."""
        return math.ceil(missing * ratio) + 1

    def draft_text(self, k: int, ratio: float, most: int | None) -> Proposal:
        """Temperature 0: greedy draft rounds until every live row's text gives k target tokens (or it drafted
        its EOS, or ``max_rounds`` ran, or ``most`` draft tokens were drafted); the first k of each row's target
        tokens, padded."""
        live = [i for i, on in enumerate(self.rows.live) if on]
        tokens, peaks = [], []  # [B] each per drafted token
        logits = self.feed().logits[:, -1]  # [B, V_draft]
        size = self.round_size(k, ratio)
        for round_index in range(self.max_rounds):
            size = size if most is None else min(size, most - len(tokens))
            if round_index:
                logits = self.feed(tokens[-1].unsqueeze(1)).logits[:, -1]
            for i in range(size):
                if i:
                    logits = self.feed(tokens[-1].unsqueeze(1)).logits[:, -1]
                token, peak = greedy_choice(logits)  # [B], [B]
                tokens.append(token)
                peaks.append(peak)
            drafted = torch.stack(tokens, 1)  # [B, n]
            host = drafted.tolist()  # one host read per round
            targets = self.to_target(host, live)
            short = [k - len(targets[i]) for i in live if self.draft_eos not in host[i]]
            if max(short, default=0) <= 0 or (most is not None and len(tokens) >= most):
                break
            size = self.round_size(max(short), ratio)
        self.drafted, self.num_fed = drafted, drafted.shape[1] - 1
        width = min(k, max(len(target) for target in targets.values()))
        proposed = [targets.get(i, [])[:width] for i in range(len(host))]
        self.stats.draft_tokens += drafted.shape[1] * len(live)
        self.stats.target_tokens += sum(len(row) for row in proposed)
        padded = [row + [self.pad] * (width - len(row)) for row in proposed]
        proposal = torch.tensor(padded, dtype=torch.long, device=drafted.device).view(len(host), width)  # [B, w]
        return Proposal(proposal, None, finite_peaks(torch.stack(peaks, 1)))

    def to_target(self, drafted: list[list[int]], live: list[int]) -> dict[int, list[int]]:
        """Each live row's drafted continuation as target tokens (``TokenBridge.to_target``)."""
        rows = self.rows
        started = time.perf_counter()
        targets = self.bridge.to_target([rows.target_ids[i] for i in live], [rows.target_synced[i] for i in live],
                                        [rows.draft_ids[i] + drafted[i] for i in live],
                                        [len(rows.draft_ids[i]) for i in live])
        self.stats.bridge_seconds += time.perf_counter() - started
        return dict(zip(live, targets))

    def draft_shared(self, k: int, sampling: SamplingConfig, generator: torch.Generator,
                     stop: StopHook | None) -> Proposal:
        """Temperature > 0: k target tokens, each drawn from the draft's distribution restricted to the shared
        tokens (TLI), fed to the draft as the draft token of the same text."""
        tokens, drafted, probs, peaks = [], [], [], []  # [B], [B], [B, V_target], [B] per drafted token
        logits = self.feed().logits[:, -1]  # [B, V_draft]
        for i in range(k):
            q = self.shared_probs(logits, sampling)  # [B, V_target]
            token = sample(q, generator)  # [B] target ids, all shared
            tokens.append(token)
            drafted.append(self.bridge.target_to_draft[token])
            probs.append(q)
            peaks.append(logits.amax(-1))
            if i == k - 1 or (stop is not None and stop(token, logits)):
                break
            logits = self.feed(drafted[-1].unsqueeze(1)).logits[:, -1]
        self.drafted, self.num_fed = torch.stack(drafted, 1), len(drafted) - 1
        generating = sum(self.rows.live)
        self.stats.draft_tokens += len(drafted) * generating
        self.stats.target_tokens += len(drafted) * generating
        return Proposal(torch.stack(tokens, 1), torch.stack(probs, 1), finite_peaks(torch.stack(peaks, 1)))

    def shared_probs(self, logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        """[B, V_draft] draft logits -> [B, V_target] q': the sampling settings, then TLI; a point mass at the
        shared token with the highest draft logit where q' has no mass."""
        restricted = self.bridge.restrict(logits_to_probs(logits, sampling))
        best = self.bridge.shared_target_ids[logits[:, self.bridge.shared_draft_ids].argmax(-1)]  # [B]
        point = one_hot_probs(best, self.bridge.target_vocab_size)  # [B, V_target]
        missing = restricted.no_shared_mass  # [B]
        self.no_shared_mass += (missing & self.live_mask(missing)).sum()
        return torch.where(missing.unsqueeze(1), point, restricted.probs)

    def live_mask(self, like: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(like) if self.live is None else self.live

    def commit(self, outcome: StepOutcome) -> None:
        """Add each generating row's emitted tokens, re-encode their text after its draft context, keep the
        cache's valid prefix (all but ``hold_back`` tokens) and queue the rest; or ask for a rebuild."""
        if self.bridge is None:
            super().commit(outcome)
            return
        rows, batch = self.rows, outcome.num_new.shape[0]
        width, drafted_width = outcome.new_tokens.shape[1], self.drafted.shape[1]
        read = torch.cat([outcome.num_new, outcome.active_after.long(), self.no_shared_mass,
                          outcome.new_tokens.flatten(), self.drafted.flatten()]).tolist()  # one host read
        num_new, live_after = read[:batch], read[batch : 2 * batch]
        self.stats.no_shared_mass += read[2 * batch]
        emitted_at, drafted_at = 2 * batch + 1, 2 * batch + 1 + batch * width  # where each part starts
        new_tokens = [read[emitted_at + i * width : emitted_at + i * width + n] for i, n in enumerate(num_new)]
        drafted = [read[drafted_at + i * drafted_width : drafted_at + (i + 1) * drafted_width] for i in range(batch)]
        for i in range(batch):
            rows.target_ids[i] += new_tokens[i]
        queued_before = rows.queued()
        num_kept = self.resync([i for i in range(batch) if live_after[i]], drafted)
        for i in range(batch):
            if not live_after[i]:
                rows.live[i], rows.cached[i] = False, len(rows.draft_ids[i])  # frozen, nothing queued
        if not self.needs_prefill:
            self.keep_and_queue(num_kept, queued_before)
        self.live = None if outcome.all_active_after else outcome.active_after
        self.end_step(outcome.num_new.device)

    def resync(self, live: list[int], drafted: list[list[int]]) -> list[int]:
        """Re-encode each live row's new text after its draft context (drafts included, so accepted ones stay);
        returns each row's number of fed tokens the cache keeps, and asks for a rebuild where a rewrite reaches
        past the cached tokens."""
        rows = self.rows
        started = time.perf_counter()
        spans = self.bridge.target_text([rows.target_ids[i] for i in live], [rows.target_synced[i] for i in live])
        candidates = [rows.draft_ids[i] + drafted[i] for i in live]
        results = self.bridge.resync(candidates, [len(rows.draft_ids[i]) for i in live],
                                     [span.text for span in spans])
        self.stats.bridge_seconds += time.perf_counter() - started
        num_kept = [0] * len(rows.cached)
        for i, span, result, candidate in zip(live, spans, results, candidates):
            new_ids = candidate[: result.keep] + result.feed
            fed_end = len(rows.draft_ids[i]) + self.num_fed
            cached = min(result.keep, len(new_ids) - self.hold_back, fed_end)
            if result.keep < rows.cached[i] or len(new_ids) <= rows.cached[i]:
                self.needs_prefill = True  # the cache holds tokens the new encoding replaced
            cached = max(cached, rows.cached[i])
            num_kept[i] = cached - rows.cached[i]
            rows.draft_ids[i], rows.cached[i], rows.target_synced[i] = new_ids, cached, span.end
        return num_kept

    def keep_and_queue(self, num_kept: list[int], queued_before: list[int]) -> None:
        """The one rollback: each row keeps its first ``num_kept`` fed tokens; its unkept tokens are queued."""
        rows, device = self.rows, self.context.queue.device
        fed_width = self.context.queue_fed  # the queue's columns, if fed this step (then its rows' real tokens end it)
        max_kept = max(max(fed_width - queued + kept for queued, kept in zip(queued_before, num_kept)), 0)
        queue, valid = left_padded([ids[n:] for ids, n in zip(rows.draft_ids, rows.cached)], device)
        kept = self.context.kept_prefix(torch.tensor(num_kept, device=device))  # [B, R]
        self.context.keep(kept, True, max_kept, queue, valid)

    def select_rows(self, index: torch.Tensor) -> None:
        super().select_rows(index)
        if self.bridge is not None:
            self.rows = self.rows.select(index.tolist())
            self.drafted = self.drafted[index]


def check_text_options(look_behind: object, hold_back: object, max_rounds: object, translate: object) -> None:
    for name, value in (("look_behind", look_behind), ("hold_back", hold_back), ("max_rounds", max_rounds)):
        if as_integer(value) is None or value < 1:
            raise ValueError(f"{name} must be an integer >= 1 (tokens, or rounds), got {value!r}")
    if translate not in TRANSLATIONS:
        raise ValueError(f"translate must be one of {', '.join(TRANSLATIONS)}, got {translate!r}")


def special_prefix(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before a text (a BOS), which begin every draft context."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    marked = tokenizer("a", add_special_tokens=True)["input_ids"]
    cut = len(marked) - len(plain)
    return marked[:cut] if cut > 0 and marked[cut:] == plain else []


def left_padded(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, m] the rows left-padded with 0, and [B, m] 1 where real (None: no padding)."""
    width = max(len(row) for row in rows)
    tokens = torch.tensor([[0] * (width - len(row)) + row for row in rows], dtype=torch.long, device=device)
    if all(len(row) == width for row in rows):
        return tokens, None
    valid = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows], dtype=torch.long,
                         device=device)
    return tokens, valid
