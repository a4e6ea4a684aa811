"""Platform adapters: transport -> ttsengine.protocol -> Engine -> protocol -> transport. Nothing else."""
