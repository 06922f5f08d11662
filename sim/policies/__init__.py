"""Decisions the stages delegate: routing, balancing, speculative decoding, admission,
decode KV admission, chunking and expert placement (EPLB)."""
