"""Drop-in replacements for other loaders' Python APIs, over sluice (sluice.compat.runai)."""
