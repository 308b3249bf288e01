"""Planning: what a run of a workflow does and what it needs, before anything is created."""
