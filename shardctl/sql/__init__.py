"""SQL text: template rendering, migration files, and every catalog/control query."""
