"""Models: presets (the only models anything loads), CPU linear packing, ZeroGPU durations."""
