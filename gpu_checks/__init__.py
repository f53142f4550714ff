"""CUDA footprint assertions of KV block sizes (the byte side of the spec's block count)."""
