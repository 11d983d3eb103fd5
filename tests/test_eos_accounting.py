"""Accepted counts stop at EOS for every drafter: a draft past the EOS that ends a row is never counted as accepted,
even where the drafter proposes all k tokens at once (Medusa's heads) and the target, which decodes on past its
EOS, agrees with them. Every target call emits its kept drafts and at most one token more, and every call but the
last emits that one more, so per row: target_calls - 1 <= emitted - accepted <= target_calls."""

import torch

import specdec
from specdec.prompts import load_prompts


def test_medusa_counts_no_draft_past_eos_as_accepted():
    pair = specdec.load_pair("embedded", device="cpu")
    decoder = specdec.Decoder(pair.target, specdec.MedusaDrafter.from_pair(pair), specdec.Greedy(),
                              specdec.FixedLength(4), specdec.SamplingConfig())
    # heldout-003..005 end at an EOS the heads drafted past (before the fix heldout-005 read accepted 3, emitted 2)
    prompts = {p.id: p.text for p in load_prompts("embedded_heldout", limit=6)}
    for prompt_id in ("heldout-003", "heldout-004", "heldout-005"):
        ids = torch.tensor([pair.tokenizer(prompts[prompt_id]).input_ids])
        out = decoder.generate(ids, torch.ones_like(ids), 24, pair.tokenizer.eos_token_id, 0)
        row = out.stats.rows[0]
        assert out.tokens[0][-1] == pair.tokenizer.eos_token_id, prompt_id  # the case: the row ended at EOS
        assert row.target_calls - 1 <= row.emitted - row.accepted <= row.target_calls, (prompt_id, row)
        assert sum(j * h for j, h in enumerate(row.steps_by_accepted)) == row.accepted
