"""SageMaker deploy-time tools."""
