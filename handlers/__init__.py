"""Platform adapters: transport -> ttsengine.serving.protocol -> Engine -> protocol -> transport. Nothing else."""
