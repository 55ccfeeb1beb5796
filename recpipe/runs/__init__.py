"""Comparing MLflow runs: the days of a daily retrain, or manual runs of different configs."""
