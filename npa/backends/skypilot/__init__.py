"""The SkyPilot backend: a run as one managed job (its stages chained in dependency order)."""
