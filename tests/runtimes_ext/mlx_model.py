"""Build a tiny random-weight MLX model folder that ``mlx_lm.load`` accepts, offline.

The folder is what mlx-community publishes, scaled down: ``config.json`` for a llama
model with tiny dimensions, ``model.safetensors`` written by mlx-lm's own ``save_model``,
and a small BPE tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) trained on a
few sentences, with a small chat template.

The output matrix is scaled up and the special tokens' rows zeroed, so decoding almost
never picks ``</s>`` or another special token: tests that count tokens (max_tokens,
cancel) see full streams of plain text.
"""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIALS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a small model writes short words and long sentences",
    "hello world, this is a tiny test of streaming tokens",
    "numbers 0 1 2 3 4 5 6 7 8 9 and punctuation . , ! ?",
]


def _write_tokenizer(folder: Path, *, chat_template: str | None) -> int:
    """A character-level BPE over printable ASCII with a Metaspace word marker, so every
    token the random model picks decodes to plain, valid text."""
    import string

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    alphabet = [c for c in string.printable if c not in " \r\x0b\x0c"] + ["\u2581"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, initial_alphabet=alphabet,
                                  limit_alphabet=len(alphabet), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        additional_special_tokens=SPECIALS[3:],
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(str(folder))
    return tok.get_vocab_size()


def write_tiny_mlx_model(folder: Path, *, chat_template: str | None = CHAT_TEMPLATE, seed: int = 7,
                         max_position_embeddings: int = 512) -> Path:
    """Write the model into ``folder`` (created) and return it."""
    import mlx.core as mx
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = _write_tokenizer(folder, chat_template=chat_template)
    eos_id = SPECIALS.index("</s>")
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        "vocab_size": vocab, "tie_word_embeddings": False, "rope_theta": 10000.0,
        "max_position_embeddings": max_position_embeddings,
        "bos_token_id": SPECIALS.index("<s>"), "eos_token_id": eos_id,
    }
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    head = model.lm_head.weight * 8.0
    for special in range(len(SPECIALS)):  # specials (</s> included) sit at logit 0, far below the top
        head = head.at[special].multiply(0.0)
    model.lm_head.weight = head
    mx.eval(model.parameters())
    save_model(folder, model)
    save_config(config, folder / "config.json")
    return folder
