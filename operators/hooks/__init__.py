"""Hooks: the operators' clients of outside systems (MLflow tracking and registry)."""
