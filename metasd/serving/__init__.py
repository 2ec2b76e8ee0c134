"""Serving many requests: rounds that share the target's passes (batch.py), those rounds in processes of their own
(remote.py), and the engine in a worker thread with the app's waiting line (streaming.py)."""
