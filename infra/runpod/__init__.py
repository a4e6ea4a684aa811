"""RunPod deploy and invoke tools."""
