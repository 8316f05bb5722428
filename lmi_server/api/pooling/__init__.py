"""The pooling front door: embeddings, score and rerank for embedding models."""
