"""The benchmark: every method side by side on the same prompts, its tables and its HTML report."""
