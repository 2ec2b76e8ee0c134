"""Training drafters on the target's own answers: distilled drafters and white-box heads."""
