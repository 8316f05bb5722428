"""sagemaker front door."""
