"""The default model's architecture (SmolLM2-135M's LlamaConfig fields), for stand-ins with
random weights where the checkpoint is not needed: the sm_90 compile's model shapes
(pq2verify.sm90.shapes) and tools/profile/model_determinism.py."""

SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
                    rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
