"""recpipe: the daily retraining pipeline for recommendation models."""
