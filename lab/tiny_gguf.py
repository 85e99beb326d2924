"""The lab's tiny GGUF for the real llama-server: a llama architecture (2 layers, 64 wide) with random weights, a
byte-level BPE vocabulary (the 256 bytes and ChatML's special tokens) and a ChatML chat template with tools in
the Hermes style (`<tool_call>` markup, which llama-server recognises and parses).

Random weights say nothing; the output head is shaped so the server's behaviour can be tested in seconds on a
CPU: a full stop comes every dozen tokens or so and the turn ends right after it, `"` is likelier than other
bytes (a JSON string the grammar opens gets closed), non-printable bytes and stray markup are unlikely (the
text stays ASCII), and `<tool_call>` is as likely as a common byte, its newline and `</tool_call>` follow
when the grammar leads there, and the turn ends after the call. Written with llama.cpp's own `gguf` package;
the same seed gives the same file.

With `experts`, each layer's feed-forward is a mixture of experts instead (llama.cpp's llama architecture with
`expert_count`: a router and stacked expert tensors, which --cpu-moe / --n-cpu-moe keep in host RAM); the
experts' output is scaled so the residual stream, and with it the behaviour above, stays as with the dense FFN.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

EMBED, LAYERS, HEADS, FFN, CONTEXT = 64, 2, 4, 128, 4096
# One merge (" t"): llama.cpp wants a BPE vocabulary to have merges; every other token is a single byte.
MERGES = ["Ġ t"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
FIRST_SPECIAL = 256 + len(MERGES)
EOS = FIRST_SPECIAL + SPECIALS.index("<|im_end|>")
TOOL_CALL = FIRST_SPECIAL + SPECIALS.index("<tool_call>")
END_CALL = FIRST_SPECIAL + SPECIALS.index("</tool_call>")
CHAT_TEMPLATE = """\
{%- if tools %}<|im_start|>system
You may call functions. Their signatures:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call one as <tool_call>{"name": <name>, "arguments": <arguments object>}</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role == "assistant" %}<|im_start|>assistant
{%- if message.content %}
{{ message.content }}
{%- endif %}
{%- if message.tool_calls %}{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}{%- endif %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: token i is byte i, as a printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write(path: Path, seed: int = 0, experts: int = 0, experts_used: int = 2, expert_ffn: int = FFN) -> Path:
    rng = np.random.default_rng(seed)
    vocab = FIRST_SPECIAL + len(SPECIALS)

    def noise(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    embeddings = noise(vocab, EMBED)
    embeddings[:, 0] = 1.0       # a direction every token shares: the small layers leave it standing
    embeddings[[ord("."), END_CALL], 1] = 1.0  # marks "a sentence or a tool call just ended"
    embeddings[TOOL_CALL, 2] = 1.0  # marks "the last token opened a tool call"
    embeddings[ord("}"), 3] = 1.0  # marks "an object just closed"
    head = noise(vocab, EMBED)
    head[:, :4] = 0.0
    head[ord("."), 0] = 0.15     # a sentence ends every dozen tokens or so...
    head[EOS, 0] = -0.3
    head[EOS, 1] = 1.2           # ...and the turn ends right after it
    head[ord('"'), 0] = 0.2      # a JSON string the grammar opened gets closed
    head[TOOL_CALL, 0] = 0.01    # as likely as a common byte: a call the grammar asks for comes within ~40 tokens
    head[ord("\n"), 2] = 1.5     # and its line ends (the parser's marker is "<tool_call>" and a newline);
    head[END_CALL, 3] = 1.5      # the arguments' object closed: the call ends, and the turn with it
    unlikely = [i for i in range(FIRST_SPECIAL, vocab) if i not in (EOS, TOOL_CALL)]  # </tool_call>: after "}"
    for token in [*range(0x20), *range(0x7F, 256), *unlikely]:
        if token != ord("\n"):
            head[token, 0] = -0.5  # no control bytes, no broken UTF-8, no stray markup

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("modelfleet tiny-lab (random weights)")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(EMBED)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(expert_ffn if experts else FFN)  # llama sizes its experts by this
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(EMBED // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(experts_used)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([*_byte_tokens(), *(m.replace(" ", "") for m in MERGES), *SPECIALS])
    writer.add_token_types([gguf.TokenType.NORMAL] * FIRST_SPECIAL + [gguf.TokenType.CONTROL] * 2
                           + [gguf.TokenType.USER_DEFINED] * 2)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(FIRST_SPECIAL)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.add_tensor("token_embd.weight", embeddings)
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(EMBED, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", noise(EMBED, EMBED))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(EMBED, dtype=np.float32))
        if experts:
            writer.add_tensor(f"blk.{i}.ffn_gate_inp.weight", noise(experts, EMBED))
            writer.add_tensor(f"blk.{i}.ffn_gate_exps.weight", noise(experts, expert_ffn, EMBED))
            writer.add_tensor(f"blk.{i}.ffn_up_exps.weight", noise(experts, expert_ffn, EMBED))
            # a wider expert sums more terms: shrink its output to the dense FFN's size
            down = noise(experts, EMBED, expert_ffn) * np.float32(np.sqrt(FFN / expert_ffn))
            writer.add_tensor(f"blk.{i}.ffn_down_exps.weight", down)
            continue
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", noise(FFN, EMBED))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", noise(FFN, EMBED))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", noise(EMBED, FFN))
    writer.add_tensor("output_norm.weight", np.ones(EMBED, dtype=np.float32))
    writer.add_tensor("output.weight", head)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":
    # tiny_gguf.py PATH [EXPERTS [EXPERT_FFN]]
    print(write(Path(sys.argv[1]), experts=int(sys.argv[2]) if len(sys.argv) > 2 else 0,
                expert_ffn=int(sys.argv[3]) if len(sys.argv) > 3 else FFN))
