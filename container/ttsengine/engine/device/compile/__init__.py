"""The compile machinery of the decode step: units (eager or torch.compile'd), precompiled units, kernel cache."""
