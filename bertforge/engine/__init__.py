"""The shared engine: attention (padded and packed), unpadding, batching by tokens."""
