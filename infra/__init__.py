"""Deploy-time tools (SageMaker, RunPod). Never imported at run time."""
