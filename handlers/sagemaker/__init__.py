"""The SageMaker adapter: inference.py (the four functions) and `serve` (BYOC)."""
