"""Build a tiny random-weight MLX model folder that ``mlx_lm.load`` accepts, offline.

The folder is what mlx-community publishes, scaled down: ``config.json`` for a llama
model with tiny dimensions, ``model.safetensors`` written by mlx-lm's own ``save_model``,
and a small BPE tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) trained on a
few sentences, with a small chat template.

The output matrix is scaled up and the special tokens' rows zeroed, so decoding almost
never picks ``</s>`` or another special token: tests that count tokens (max_tokens,
cancel) see full streams of plain text.

``byte_level=True`` writes a GPT-2 style byte-level BPE tokenizer instead (mlx-lm streams
it with its BPE detokenizer), trained on text with accented letters and symbols, so some
tokens are parts of a UTF-8 character; control bytes are kept out of the answers.
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
#: Extra text for the byte-level tokenizer: characters of two to four UTF-8 bytes.
WIDE_CORPUS = ["café naïve über", "☕ tea → coffee", "日本語のテキスト", "emoji 🙂 and 🚀"]


def _write_tokenizer(folder: Path, *, chat_template: str | None, byte_level: bool = False) -> int:
    """A character-level BPE over printable ASCII with a Metaspace word marker, so every
    token the random model picks decodes to plain, valid text (or a byte-level BPE)."""
    import string

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if byte_level:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        corpus = CORPUS + WIDE_CORPUS
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        alphabet = [c for c in string.printable if c not in " \r\x0b\x0c"] + ["\u2581"]
        corpus = CORPUS
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + 80 if byte_level else 300,
        special_tokens=SPECIALS,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tok.train_from_iterator(corpus * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=SPECIALS[3:],
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(str(folder))
    return tok.get_vocab_size()


def _quiet_tokens(folder: Path, byte_level: bool) -> list[int]:
    """Ids the model must (almost) never pick: the specials, and for byte-level the
    control bytes but newline (mlx-lm's BPE detokenizer misreads byte 0 while streaming)."""
    ids = list(range(len(SPECIALS)))
    if byte_level:
        from mlx_lm.tokenizer_utils import _byte_decoder

        vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
        ids += [vocab[c] for c, b in _byte_decoder().items() if (b < 0x20 or b == 0x7F) and b != 0x0A and c in vocab]
    return ids


def write_tiny_mlx_model(
    folder: Path,
    *,
    chat_template: str | None = CHAT_TEMPLATE,
    seed: int = 7,
    max_position_embeddings: int = 512,
    byte_level: bool = False,
) -> Path:
    """Write the model into ``folder`` (created) and return it."""
    import mlx.core as mx
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = _write_tokenizer(folder, chat_template=chat_template, byte_level=byte_level)
    eos_id = SPECIALS.index("</s>")
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "max_position_embeddings": max_position_embeddings,
        "bos_token_id": SPECIALS.index("<s>"),
        "eos_token_id": eos_id,
    }
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    head = model.lm_head.weight * 8.0
    for special in _quiet_tokens(folder, byte_level):  # specials (</s> included) sit at logit 0, far below the top
        head = head.at[special].multiply(0.0)
    model.lm_head.weight = head
    mx.eval(model.parameters())
    save_model(folder, model)
    save_config(config, folder / "config.json")
    return folder
