"""Fleet operations, one module per command: provision, migrate, verify, status, grow, rebalance, move."""
