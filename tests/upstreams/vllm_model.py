"""A tiny Llama for vLLM: ``config.json`` plus a byte-level BPE tokenizer trained here.

vLLM loads it with ``--load-format dummy`` (random weights from the config alone), so no
weights are downloaded or committed. The shape follows what vLLM's CPU attention accepts:
head dimension 64 (16 is refused), two layers, hidden size 256, four heads.

Run as a script (``python tests/upstreams/vllm_model.py DIR``) to write the folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, how are you today?",
    "localrun serves models through one endpoint",
    "vLLM runs a tiny llama with random weights",
    "Once upon a time there was a small model that counted tokens.",
    "0123456789 + - * / = ( ) [ ] { } : ; , .",
] * 20


def write_tokenizer(folder: Path, vocab_size: int = 318) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<unk>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 1024,
                "chat_template": CHAT_TEMPLATE,
            }
        )
    )
    return tok.get_vocab_size()


def write_tiny_llama(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "vocab_size": vocab,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    write_placeholder_safetensors(folder / "placeholder.safetensors")
    return folder


def write_placeholder_safetensors(path: Path) -> None:
    """One 4-byte tensor, so localrun's store registers the folder; vLLM's dummy loader reads no weights."""
    header = json.dumps({"placeholder": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0\0\0")


if __name__ == "__main__":
    print(write_tiny_llama(Path(sys.argv[1])))
