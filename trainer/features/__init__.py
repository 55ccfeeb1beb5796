"""Feature transforms inside the TensorFlow graph (training and serving)."""
