"""Models: presets, loading a preset's target and drafter weights, CPU linear packing, ZeroGPU durations."""
