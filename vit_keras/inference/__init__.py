"""Fast CPU inference (concurrent XLA micro-batches) and the throughput benchmark against timm."""
