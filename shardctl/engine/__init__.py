"""Talking to hosts: connections and locks, the fan-out over hosts, the per-host batch executor."""
