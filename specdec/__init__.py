"""specdec: speculative decoding research framework.

    import specdec
    draft, target, tokenizer = specdec.load_pair("embedded")  # or "gpt2-xl" where the hub is reachable
    out = specdec.generate(target, input_ids, draft=draft, strategy="speculative", k=4, max_new_tokens=32)
    out.tokens, out.stats.acceptance_rate, out.stats.mean_accepted_length
"""

from specdec.api import generate
from specdec.batching import left_pad
from specdec.block import BlockVerification
from specdec.traversal import Traversal
from specdec.cache import FORWARDS
from specdec.api import Decoder
from specdec.emit import GenerationOutput, NonFiniteLogitsError, StrategyVerdictError
from specdec.cross_tokenizer import CrossTokenizerDrafter
from specdec.drafters import ModelDrafter, NoDrafter, SyntheticDrafter, TreeDrafter
from specdec.dynamic_tree import DynamicTreeDrafter
from specdec.eagle import EagleDrafter
from specdec.early_exit import EarlyExitDrafter
from specdec.medusa import MedusaDrafter
from specdec.models import ModelPair, ModelUnavailableError, load_pair, resolve_device, resolve_dtype
from specdec.ngram import NGramDrafter
from specdec.prompts import Prompt, load_prompts
from specdec.policies import ConfidenceLength, CostOptimalLength, FixedLength, HeuristicLength
from specdec.sampling import SamplingConfig, logits_to_probs
from specdec.stats import DecodeStats, RowStats, predicted_speedup
from specdec.strategies import STRATEGIES, Greedy, Speculative, SyntheticAcceptance, TopK, Typical, make_strategy
from specdec.timing import Clock
from specdec.interfaces import AcceptanceStrategy, Drafter, DraftLengthPolicy
from specdec.layout import Proposal
from specdec.types import StepOutcome, Verdict

__all__ = [
    "generate",
    "left_pad",
    "FORWARDS",
    "load_pair",
    "ModelPair",
    "ModelUnavailableError",
    "resolve_device",
    "resolve_dtype",
    "load_prompts",
    "Prompt",
    "Decoder",
    "GenerationOutput",
    "NonFiniteLogitsError",
    "StrategyVerdictError",
    "StepOutcome",
    "Drafter",
    "ModelDrafter",
    "SyntheticDrafter",
    "NoDrafter",
    "TreeDrafter",
    "CrossTokenizerDrafter",
    "DynamicTreeDrafter",
    "NGramDrafter",
    "EarlyExitDrafter",
    "EagleDrafter",
    "MedusaDrafter",
    "DraftLengthPolicy",
    "FixedLength",
    "HeuristicLength",
    "ConfidenceLength",
    "CostOptimalLength",
    "SamplingConfig",
    "logits_to_probs",
    "DecodeStats",
    "RowStats",
    "predicted_speedup",
    "AcceptanceStrategy",
    "STRATEGIES",
    "Greedy",
    "Speculative",
    "BlockVerification",
    "Traversal",
    "TopK",
    "Typical",
    "SyntheticAcceptance",
    "make_strategy",
    "Proposal",
    "Clock",
    "Verdict",
]
