"""Drafters: the interface and the built-in drafters, the registry, retrieval, white-box heads, their files."""
