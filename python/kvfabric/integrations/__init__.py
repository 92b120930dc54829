"""Integrations of kvfabric with serving engines: :mod:`kvfabric.integrations.vllm`."""
