"""Tiny random models that vLLM can load, made in-process in a few seconds; nothing is
downloaded.

:func:`build_llm` trains a byte-level BPE tokenizer (``tokenizers``) on a few thousand
generated strings, gives it a chat template, and saves it next to a random
``LlamaForCausalLM`` (hidden 128, 2 layers, 2 attention heads of dim 64, 1 KV head: vLLM's
CPU attention refuses head dims below 32). The weights are random, so the text it writes
is noise — but it is the same noise for the same seed, which is all a test needs.

:func:`build_pooling` makes the pooling kinds the same way (an embedding ``LlamaModel``, a
``LlamaForSequenceClassification``). The tests and the benchmarks import it;
``python tests/llm/tinymodel.py DIR`` writes the generating one.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""A chat template in the usual shape: a role marker, the content, an end marker."""

SPECIAL = ["<|bos|>", "<|eos|>", "<|pad|>", "<|end|>"]
WORDS_TEXT = (
    "the a cat dog sat on mat red blue green sky tree river fast slow yes no json hello world "
    "model batch prompt answer question label positive negative neutral one two three four "
    'five six seven eight nine ten true false null { } [ ] : , "'
)


def corpus(count: int = 4000, seed: int = 0) -> list[str]:
    """Short strings of words, digits and JSON punctuation to train the tokenizer on."""
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        words = rng.choices(WORDS_TEXT.split(" "), k=rng.randint(3, 12))
        lines.append(" ".join(words) + f" {rng.randint(0, 9999)}")
    return lines


def build_tokenizer(directory: Path, vocab: int = 512) -> Any:
    """A byte-level BPE tokenizer with a chat template, saved in ``directory``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|end|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return fast


def build_llm(
    directory: str | Path,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    seed: int = 0,
) -> Path:
    """A random ``LlamaForCausalLM`` and its tokenizer in ``directory`` (bfloat16, heads of
    dim 64). ``hidden=512, layers=8`` (8 heads) makes a model where generation dominates."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(directory)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def build_pooling(
    directory: str | Path, kind: str = "embed", labels: int = 3, hidden: int = 128, seed: int = 0
) -> Path:
    """A tiny random model of the kind vLLM's pooling runner serves, with the tokenizer:
    ``embed``, a ``LlamaModel`` (no head: vLLM pools its last hidden state, and scores a
    pair by the cosine of their embeddings); ``classify``, a
    ``LlamaForSequenceClassification`` with ``labels`` classes named ``label0``, ... (one
    class: a cross-encoder, which vLLM also scores pairs with)."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification, LlamaModel

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(directory)
    names = {i: f"label{i}" for i in range(labels)}
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=hidden // 2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="bfloat16",
        num_labels=labels,
        id2label=names,
        label2id={v: k for k, v in names.items()},
    )
    torch.manual_seed(seed)
    model = LlamaModel(config) if kind == "embed" else LlamaForSequenceClassification(config)
    model.to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)
    return directory


if __name__ == "__main__":
    print(build_llm(sys.argv[1] if len(sys.argv) > 1 else "tiny-llm"))
