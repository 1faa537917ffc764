"""IDs: decoding at speed and routing keys to shards."""
