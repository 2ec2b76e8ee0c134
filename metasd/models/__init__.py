"""Models: presets (the only models anything loads), CPU linear packing and thread-invariant attention, ZeroGPU
durations."""
