"""The stages a request passes: vision encoder, prefill (and its path through the prefix cache),
Wide-EP decode with its experts, the KV store and its storage nodes, the SWA host cache."""
