"""Post-mortems across runs: read what a run left in its prefix, keep it in a local SQLite
store, and compare two runs stage by stage.
"""
