"""Rendering: a validated workflow -> one SkyPilot task YAML per stage; a run -> its report page."""
