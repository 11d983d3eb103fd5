"""The GPU suite's plans: what it measures, in which order, and the seconds each section may spend (the short plan
for a 15-minute lease, the full one for a longer lease, and the smoke run's rehearsal of either on CPU)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# The JSON's headline keys (issues 24 and 36), null where their item was skipped or failed.
HEADLINE_KEYS = (
    "device", "preflight", "copy_bandwidth_tbps", "ar_batch1_tok_s", "ar_batch1_share_of_bound",
    "hf_best_ar_batch1_tok_s", "draft_target_cost_ratio", "spec_speedup_a07_best", "spec_speedup_a07_best_k",
    "spec_measured_over_predicted_a07", "spec_ks_measured", "embedded_ours_over_hf_assisted",
    "identical_greedy_tokens",
)
HEADLINE_ACCEPTANCE = 0.7

# Our autoregressive modes: name -> specdec.Decoder options.
AR_MODES = {
    "lean_compiled": dict(forward="lean", compile=True, step="device"),
    "lean": dict(forward="lean", compile=False, step="host"),
    "eager": dict(forward="transformers", compile=False, step="host"),
    "compiled": dict(forward="transformers", compile=True, step="host"),
}
HF_PEERS = ("hf_static", "hf_static_compiled", "hf_generate")  # transformers' autoregressive paths, batch 1
# The order first calls are paid in: the headline's two first (ours fastest, transformers' fastest), the costliest
# to compile last, so a short budget skips those.
AR_PRIORITY = ("lean_compiled", "hf_static", "eager", "lean", "hf_generate", "compiled", "hf_static_compiled")


@dataclass(frozen=True)
class SuitePlan:
    """What the suite measures, in which order, and the seconds it may spend."""

    name: str
    sections: tuple[str, ...]  # after the preflight, in order: the headline's, then the rest
    device: str
    pair: str  # the pair of the autoregressive and speculative sections: a load_pair preset, or "tiny"
    dtype: str
    compile: bool  # our fastest path compiled (the smoke run's CPU plan runs it uncompiled: inductor takes seconds
    # per shape there; the device step then runs as tests/test_device_step.py runs it)
    threads: int | None  # torch CPU threads (None: torch's choice)
    modes: tuple[str, ...]  # our autoregressive modes (AR_MODES)
    peers: tuple[str, ...]  # transformers' autoregressive paths (HF_PEERS)
    batch_sizes: tuple[int, ...]  # the first is the ar_batch1 section's, the rest ar_batches'
    prompt_tokens: int  # random tokens per prompt
    ar_new_tokens: int
    ar_rounds: int
    ks: tuple[int, ...]  # in the order measured: the likely best k of acceptance 0.7 first
    more_acceptances: tuple[float, ...]  # spec_acceptances: measured at the k values 0.7 measured
    spec_prompts: int
    spec_new_tokens: int
    cost_repeats: int
    reads_new_tokens: int  # the longer call of the host_reads section (the shorter: a quarter)
    embedded_dtypes: tuple[str, ...]  # the first gives the headline
    embedded_prompts: int
    embedded_new_tokens: int
    study_overrides: tuple[str, ...]
    budget_seconds: float  # the whole suite, the preflight and model loading included
    shares: dict = field(default_factory=dict)  # section -> seconds it may count on
    first_call_guess: dict = field(default_factory=dict)  # "compiled"/"eager" -> seconds of a first call not yet seen
    preflight_dtype: str = "float64"  # the preflight's tiny models: no near-tie can flip a greedy token


HEADLINE_SECTIONS = ("bandwidth", "ar_batch1", "cost_ratio", "speculative", "embedded")
REST_SECTIONS = ("ar_batches", "spec_acceptances", "study", "host_reads")
STUDY_OVERRIDES = ("pair=gpt2-xl-shaped", "strategy=synthetic", "strategy.acceptance=0.7", "sampling=greedy",
                   "draft_length.k=4", "num_prompts=3", "max_new_tokens=64", "warmup=1", "dtype=bfloat16")

SHORT = SuitePlan(  # one H100: ~420 s of sections, the preflight and loading included, ~20 s of imports: 8 minutes
    name="short", sections=(*HEADLINE_SECTIONS, *REST_SECTIONS), device="cuda", pair="gpt2-xl-shaped",
    dtype="bfloat16", compile=True, threads=None, modes=("lean_compiled",), peers=("hf_static",),
    batch_sizes=(1, 8, 64), prompt_tokens=32, ar_new_tokens=128, ar_rounds=3, ks=(3, 4, 5, 2, 6),
    more_acceptances=(0.6, 0.8), spec_prompts=4, spec_new_tokens=128, cost_repeats=20, reads_new_tokens=64,
    embedded_dtypes=("float32",), embedded_prompts=6, embedded_new_tokens=64, study_overrides=STUDY_OVERRIDES,
    budget_seconds=420.0,
    # The headline's shares (the rest have none): the preflight compiles tiny models four times; ar_batch1 pays two
    # first compiled GPT-2 XL calls (ours ~45 s, transformers' ~60 s; the H200's first compiled call took 44 s);
    # speculative compiles one verification graph, then captures per k; embedded compiles two small pairs' paths.
    shares={"preflight": 40, "bandwidth": 15, "ar_batch1": 125, "cost_ratio": 25, "speculative": 110,
            "embedded": 75},
    first_call_guess={"compiled": 60.0, "eager": 5.0},
)
FULL = replace(  # a longer lease: every mode and peer, every k, both embedded dtypes; ~9 minutes
    SHORT, name="full", modes=tuple(AR_MODES), peers=HF_PEERS, ks=(3, 4, 5, 2, 6, 1, 7, 8),
    embedded_dtypes=("float32", "bfloat16"), embedded_prompts=8, budget_seconds=520.0,
    shares={"preflight": 40, "bandwidth": 15, "ar_batch1": 170, "cost_ratio": 20, "speculative": 130,
            "embedded": 90},
)
PLANS = {"short": SHORT, "full": FULL}


def smoke(plan: SuitePlan) -> SuitePlan:
    """``plan`` rehearsed on CPU: the same sections, modes, peers, k values and acceptances, on tiny models and
    budgets, uncompiled (``--compile`` compiles on CPU too)."""
    return replace(
        plan, device="cpu", pair="tiny", dtype="float32", compile=False, threads=1, batch_sizes=(1, 2),
        prompt_tokens=8, ar_new_tokens=4, ar_rounds=1, spec_prompts=1, spec_new_tokens=6, cost_repeats=2,
        reads_new_tokens=24, embedded_dtypes=plan.embedded_dtypes[:1], embedded_prompts=1, embedded_new_tokens=4,
        study_overrides=("pair=embedded", "device=cpu", "dtype=float32", "compile=false", "strategy=synthetic",
                         "strategy.acceptance=0.7", "sampling=greedy", "draft_length.k=2", "num_prompts=1",
                         "max_new_tokens=4", "warmup=1"),
        budget_seconds=120.0,
        shares={"preflight": 10, "bandwidth": 1, "ar_batch1": 10, "cost_ratio": 2, "speculative": 10,
                "embedded": 20},
        first_call_guess={"compiled": 2.0, "eager": 1.0},
    )
