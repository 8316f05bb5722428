"""config.json excerpts of public models (the keys blending reads: architecture, attention, RoPE)."""

SMOLLM2_135M = {  # transformers 5 style: rope_parameters
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "head_dim": 64,
    "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
    "max_position_embeddings": 8192, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
}
LLAMA31_8B = {  # old style: rope_theta + rope_scaling
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
    "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rope_scaling": None,
    "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28,
}
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "head_dim": 128,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 36,
    "max_position_embeddings": 40960, "rope_theta": 1000000, "rope_scaling": None,
    "sliding_window": None, "use_sliding_window": False,
}
QWEN25_YARN = {**QWEN25_7B, "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}
GEMMA3_LIKE = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152, "head_dim": 256,
    "num_attention_heads": 4, "num_key_value_heads": 1, "num_hidden_layers": 26,
    "rope_parameters": {"full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
                        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
}
