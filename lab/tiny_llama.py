"""The lab's tiny Llama checkpoint for the real vLLM: a Hugging Face folder (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, generation_config.json) of LlamaForCausalLM with random weights (2 layers,
128 wide), a byte-level BPE tokenizer trained here with `tokenizers` on a small built-in corpus, and lab/tiny_gguf's
ChatML chat template with Hermes-style tool calls (vLLM's `hermes` tool-call parser reads `<tool_call>` markup).

It runs inside the lab's vLLM image (`lab/build-vllm.sh`: its torch, safetensors and tokenizers), so the project's
own environment needs none of them: `docker run ... python tiny_llama.py OUT`. The same seed gives the same files,
so the hub double serves it at the same commit every time.

Random weights say nothing; the output head is shaped as tiny_gguf's is, so the server can be tested in seconds:
a full stop comes every dozen tokens or so and the turn ends right after it (an answer is never empty: the first
token follows the prompt's newline), `"` is likelier (a JSON string the tool-call grammar opens gets closed), and
special tokens, control bytes and broken UTF-8 are unlikely. A tool call comes from vLLM's own structured output
(tool_choice `required`), not from the model's choice.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# head_dim 64: the CPU attention kernels have no 16 (tiny_gguf's 64 / 4 heads):
# "Unsupported CPU attention configuration"
EMBED, LAYERS, HEADS, FFN, CONTEXT, VOCAB = 128, 2, 2, 256, 4096, 512
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
EOS = "<|im_end|>"


def chat_template() -> str:
    """tiny_gguf's template (read from its source: importing it needs gguf, which the vLLM image lacks)."""
    source = (Path(__file__).resolve().parent / "tiny_gguf.py").read_text()
    start = source.index('CHAT_TEMPLATE = """\\\n') + len('CHAT_TEMPLATE = """\\\n')
    return source[start:source.index('"""', start)]


def corpus() -> list[str]:
    """What the tokenizer learns from: chat turns, tool calls and their JSON, some plain English."""
    words = ("the weather in Paris is clear and the temperature is eighteen degrees . What is two plus two ? "
             "Answer in one short sentence . You may call functions . Their signatures : get_weather city "
             "Current weather for a city . Who are you ? I am a tiny model with random weights , not a real one . "
             "modelfleet serves open weight models on bare metal GPU servers with vLLM , SGLang and llama.cpp .")
    calls = [json.dumps({"name": "get_weather", "arguments": {"city": city}})
             for city in ("Paris", "Berlin", "Tokyo", "Lima", "Oslo")]
    lines = [words] * 4 + calls + [json.dumps({"city": "Paris", "temperature_c": 18, "sky": "clear"})]
    return lines + ["".join(chr(c) for c in range(32, 127))]  # every printable byte once


def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(SPECIALS), special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(), trainer)
    return tokenizer


def weights(tokenizer, seed: int) -> dict:
    import torch

    generator = torch.Generator().manual_seed(seed)
    vocab = tokenizer.get_vocab_size()

    def noise(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.02

    pieces = {i: tokenizer.decode([i], skip_special_tokens=False) for i in range(vocab)}
    special = {tokenizer.token_to_id(name) for name in SPECIALS}
    period, eos = tokenizer.token_to_id("."), tokenizer.token_to_id(EOS)
    embeddings = noise(vocab, EMBED)
    embeddings[:, 0] = 1.0       # a direction every token shares: the small layers leave it standing
    embeddings[period, 1] = 1.0  # marks "a sentence just ended"
    head = noise(vocab, EMBED)
    head[:, :2] = 0.0
    head[period, 0] = 0.35       # a sentence ends every dozen tokens or so...
    head[eos, 1] = 1.2           # ...and the turn ends right after it
    for i, piece in pieces.items():
        if i in special:
            head[i, 0] = -0.5 if i != eos else -0.3  # no stray markup; the end only after a full stop
            continue
        if '"' in piece:
            head[i, 0] = 0.2     # a JSON string the grammar opened gets closed
        if "\ufffd" in piece or not (piece.isprintable() or piece == "\n"):
            head[i, 0] = -0.5    # no control bytes, no broken UTF-8 (a lone byte decodes to U+FFFD)
    tensors = {"model.embed_tokens.weight": embeddings, "model.norm.weight": torch.ones(EMBED),
               "lm_head.weight": head}
    for i in range(LAYERS):
        layer = f"model.layers.{i}"
        tensors[f"{layer}.input_layernorm.weight"] = torch.ones(EMBED)
        tensors[f"{layer}.post_attention_layernorm.weight"] = torch.ones(EMBED)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[f"{layer}.self_attn.{name}.weight"] = noise(EMBED, EMBED)
        tensors[f"{layer}.mlp.gate_proj.weight"] = noise(FFN, EMBED)
        tensors[f"{layer}.mlp.up_proj.weight"] = noise(FFN, EMBED)
        tensors[f"{layer}.mlp.down_proj.weight"] = noise(EMBED, FFN)
    return {name: t.to(torch.bfloat16).contiguous() for name, t in tensors.items()}


def write(out: Path, seed: int = 0) -> Path:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    tokenizer.save(str(out / "tokenizer.json"))
    ids = {name: tokenizer.token_to_id(name) for name in SPECIALS}
    save_file(weights(tokenizer, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": EMBED,
              "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
              "num_key_value_heads": HEADS, "head_dim": EMBED // HEADS, "max_position_embeddings": CONTEXT,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
              "vocab_size": tokenizer.get_vocab_size(), "bos_token_id": ids["<|endoftext|>"],
              "eos_token_id": ids[EOS], "torch_dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids[EOS]}, indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": CONTEXT, "add_bos_token": False,
         "bos_token": "<|endoftext|>", "eos_token": EOS, "pad_token": "<|endoftext|>",
         "chat_template": chat_template()}, indent=2, sort_keys=True) + "\n")
    return out


if __name__ == "__main__":
    print(write(Path(sys.argv[1])))
