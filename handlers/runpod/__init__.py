"""RunPod serverless adapter: `python -m handlers runpod`."""
