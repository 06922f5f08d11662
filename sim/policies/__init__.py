"""Decisions the stages delegate: routing, balancing, speculative decoding, admission,
chunking and expert placement (EPLB)."""
