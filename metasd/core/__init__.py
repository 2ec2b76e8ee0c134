"""The vocabulary every layer speaks: settings and their validation, the sampling math, events and the run file
format, cost models, and the messages a round's passes are asked for (passes.py). Imports no model code."""
