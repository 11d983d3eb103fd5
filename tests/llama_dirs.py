"""Tiny Llama-shaped model directories, saved in-process as a downloaded model is (save_pretrained of the model
and of its tokenizer, with a chat template): what `pair.target=DIR` and `train_drafter pair.target=DIR` read."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import WORDS
from transformers import LlamaConfig, LlamaForCausalLM

# A chat template in the form instruct models ship (role markers, an end-of-turn token, a generation prompt).
CHAT_TEMPLATE = ("{% for message in messages %}<{{ message['role'] }}> {{ message['content'] }} <eos> "
                 "{% endfor %}{% if add_generation_prompt %}<assistant> {% endif %}")


def word_tokenizer():
    """A word-level tokenizer over conftest's words, with role markers, an eos and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<pad>", "<eos>", "<bos>", "<user>", "<assistant>", "<system>"]
    vocab = {token: i for i, token in enumerate([*specials, *WORDS, "?", ".", ","])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<pad>",
                                        eos_token="<eos>", bos_token="<bos>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tiny_llama(path: Path, seed: int = 0, layers: int = 2, width: int = 32) -> Path:
    """A random-weight LlamaForCausalLM (grouped-query attention, RoPE, untied embeddings, as SmolLM2's family)
    saved with its tokenizer under ``path``."""
    tokenizer = word_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=False, initializer_range=0.2)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
