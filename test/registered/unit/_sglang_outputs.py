"""The fields of SGLang's batch output structs that carry per-token extras (logprobs, hidden states, ...).

The unit tests build real ``BatchTokenIDOutput`` / ``BatchStrOutput`` objects
for finished requests that asked for none of these, so every such field is
None; one list keeps the two tests in step with SGLang 0.5.23's constructors.
"""

NO_PER_TOKEN_EXTRAS = dict.fromkeys((
    "input_token_logprobs_val", "input_token_logprobs_idx",
    "output_token_logprobs_val", "output_token_logprobs_idx",
    "input_top_logprobs_val", "input_top_logprobs_idx",
    "output_top_logprobs_val", "output_top_logprobs_idx",
    "input_token_ids_logprobs_val", "input_token_ids_logprobs_idx",
    "output_token_ids_logprobs_val", "output_token_ids_logprobs_idx",
    "output_token_entropy_val", "output_token_sampling_mask", "output_hidden_states",
    "routed_experts", "indexer_topk", "placeholder_tokens_idx", "placeholder_tokens_val",
))
