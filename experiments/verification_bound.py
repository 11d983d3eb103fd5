"""How close each verification rule comes to the best any lossless verifier can do, on a small vocabulary.

    python -m experiments.verification_bound                   # 8-token pair of specdec.testing, T = 1
    python -m experiments.verification_bound --contexts 50 --k 2 --temperature 0.7

For each of --contexts random contexts, the tiny pair's exact p and q after every prefix of up to k tokens
(``specdec.testing.tiny_model``: the target and draft ``check_lossless`` uses, V = 8). Chains of k drafts: kept
drafts per step of token-wise speculative sampling (exact) and block verification (Monte Carlo), against the LP of
a verifier that would know p off the drafted path too (``specdec.bound.optimal_chain_length``); tau per step =
1 + kept. n drafts at one position: recursive rejection sampling's P(a draft is kept) against Hu et al.'s optimum
(``optimal_multidraft_acceptance``). Prints means over the contexts and each rule's share of the best.
"""

from __future__ import annotations

import argparse

import torch

from specdec.block import BlockVerification
from specdec.bound import mean_kept, optimal_chain_length, optimal_multidraft_acceptance, tokenwise_chain_length
from specdec.rules import speculative_tree
from specdec.sampling import SamplingConfig, logits_to_probs
from specdec.strategies import Speculative
from specdec.testing import TEST_VOCAB, tiny_model
from specdec.tree import tree_shape

SAMPLES = 100_000  # Monte Carlo chains per context and rule


def prefix_tables(model, context: list[int], k: int, sampling: SamplingConfig) -> list[torch.Tensor]:
    """[V ** d, V] for d = 0..k: the model's distribution after ``context`` and each prefix of d tokens."""
    vocab = model.config.vocab_size
    tables = []
    for d in range(k + 1):
        prefixes = torch.cartesian_prod(*[torch.arange(vocab)] * d).view(-1, d) if d else torch.zeros(1, 0).long()
        ids = torch.cat([torch.tensor(context).expand(prefixes.shape[0], -1), prefixes], 1)
        with torch.no_grad():
            probs = logits_to_probs(model(ids).logits[:, -1], sampling).double()  # [V ** d, V]
        tables.append(probs / probs.sum(-1, keepdim=True))
    return tables


def rrs_kept(p: torch.Tensor, q: torch.Tensor, n: int, generator: torch.Generator) -> float:
    """P(recursive rejection sampling keeps one of n i.i.d. drafts of q at one position), Monte Carlo."""
    tokens = torch.multinomial(q.expand(SAMPLES, -1), n, replacement=True, generator=generator)  # [S, n]
    vocab = p.shape[-1]
    verdict = speculative_tree(tree_shape((n,)), tokens, q.expand(SAMPLES, 1, vocab),
                               p.expand(SAMPLES, n + 1, vocab), generator)
    return verdict.num_accepted.double().mean().item()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser("experiments.verification_bound", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, default=20)
    parser.add_argument("--k", type=int, default=2, help="chain length (the LP has 8^k x 8^k variables)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sampling = SamplingConfig(temperature=args.temperature)
    target, draft = tiny_model(seed=10, layers=2), tiny_model(seed=12, layers=1, init=0.1)
    g = torch.Generator().manual_seed(args.seed)
    chains = {"token-wise": [], "block": [], "best (full information)": []}
    drafts = {n: ([], []) for n in (1, 2, 4)}
    for _ in range(args.contexts):
        context = torch.randint(TEST_VOCAB, (6,), generator=g).tolist()
        p, q = prefix_tables(target, context, args.k, sampling), prefix_tables(draft, context, args.k, sampling)
        chains["token-wise"].append(tokenwise_chain_length(p, q, args.k))
        chains["block"].append(mean_kept(BlockVerification(), p, q, args.k, SAMPLES, g))
        chains["best (full information)"].append(optimal_chain_length(p, q, args.k))
        for n, (rule, best) in drafts.items():
            rule.append(rrs_kept(p[0][0], q[0][0], n, g))
            best.append(optimal_multidraft_acceptance(p[0][0], q[0][0], n))
    best_tau = 1 + sum(chains["best (full information)"]) / args.contexts
    print(f"Chains of k = {args.k}, T = {args.temperature}, {args.contexts} contexts of the V = {TEST_VOCAB} pair")
    print("| rule | kept drafts per step | tau per step | share of the best tau |\n|---|---|---|---|")
    for name, kept in chains.items():
        tau = 1 + sum(kept) / args.contexts
        print(f"| {name} | {tau - 1:.4f} | {tau:.4f} | {tau / best_tau:.1%} |")
    print(f"\nn i.i.d. drafts at one position: P(a draft is kept)\n| n | recursive rejection sampling | best (Hu et "
          f"al. LP) | share |\n|---|---|---|---|")
    for n, (rule, best) in drafts.items():
        mean_rule, mean_best = sum(rule) / args.contexts, sum(best) / args.contexts
        print(f"| {n} | {mean_rule:.4f} | {mean_best:.4f} | {mean_rule / mean_best:.1%} |")


if __name__ == "__main__":
    main()
