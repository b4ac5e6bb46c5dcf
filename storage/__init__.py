"""Tensor blobs in object storage: keys, codec, digests, the write-once store, cleanup."""
