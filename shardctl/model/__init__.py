"""The data model: topology (load, validate, edit), shard ranges, identifiers, DSNs, ID layouts. No I/O beyond files."""
