"""The workflow spec: model, loader, validation and JSON Schema."""
