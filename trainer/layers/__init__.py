"""Small composable Keras layers (tf-keras): embeddings, MLP, FM, cross, dot interaction."""
