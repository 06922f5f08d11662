"""Synthetic workloads: multi-day chatbot/agent sessions and multimodal (image) requests."""
