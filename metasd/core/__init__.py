"""The engine core: the round loop, its events, verification, costs, validation, streaming and run files."""
