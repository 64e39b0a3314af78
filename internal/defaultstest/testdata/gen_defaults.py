"""Writes transformers_defaults.json: for each architecture, a config.json
that omits every field a size does not need, and the values transformers'
configuration class holds for the fields the plugins derive from (read back
from the class, not written by hand).

    .venv/client/bin/python internal/defaultstest/testdata/gen_defaults.py
"""

import json
import pathlib

import transformers
from transformers import CONFIG_MAPPING

SIZES = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
         "num_attention_heads": 16, "vocab_size": 256}

# Per model_type: extra fields of the minimal config, and what to read back.
ARCHS = {
    "llama": {},
    "mistral": {},
    "olmo2": {},
    "gemma3_text": {},
    # longrope with no top-level original_max_position_embeddings: the
    # class's top-level default overrides the rope parameters' own.
    # 32 heads: the classes' default KV heads (32) must divide them.
    "qwen3": {"num_attention_heads": 32},
    # MoE sizes, every layer dense (a config alone holds no expert tensors).
    "qwen3_moe": {"moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [0, 1]},
    # Multimodal: the language model's fields under text_config.
    "qwen3_vl": {"text_config": {**SIZES, "num_attention_heads": 32}},
    "qwen3_vl_moe": {"text_config": {**SIZES, "moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2,
                                     "mlp_only_layers": [0, 1]}},
    "phi3": {"rope_parameters": {"rope_type": "longrope", "short_factor": [1, 1, 1, 1],
                                 "long_factor": [2, 2, 2, 2], "original_max_position_embeddings": 32}},
}


def rope(c, layer_type=None):
    p = c.rope_parameters
    return p[layer_type] if layer_type else p


def main():
    out = {"transformers": transformers.__version__, "archs": {}}
    for mt, extra in ARCHS.items():
        config = {"model_type": mt, **extra} if "text_config" in extra else {"model_type": mt, **SIZES, **extra}
        top = CONFIG_MAPPING[mt].from_dict(json.loads(json.dumps(config)))
        c = top.text_config if "text_config" in extra else top
        full = rope(c, "full_attention" if mt == "gemma3_text" else None)
        want = {
            "rms_norm_eps": c.rms_norm_eps,
            "num_key_value_heads": c.num_key_value_heads,
            "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
            "tie_word_embeddings": top.tie_word_embeddings,
            "rope_theta": full["rope_theta"],
            "config.max_position_embeddings": c.max_position_embeddings,
        }
        if mt == "gemma3_text":
            want["config.rope_local_base_freq"] = rope(c, "sliding_attention")["rope_theta"]
            want["config.sliding_window"] = c.sliding_window
            want["config.query_pre_attn_scalar"] = c.query_pre_attn_scalar
        if mt == "mistral":
            want["config.sliding_window"] = c.sliding_window
        if mt == "phi3":
            want["rope.original_max_position_embeddings"] = full["original_max_position_embeddings"]
        out["archs"][mt] = {"config": config, "want": want}
    path = pathlib.Path(__file__).with_name("transformers_defaults.json")
    path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
