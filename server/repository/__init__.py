"""The model repository: layout, config.json, version policies, states, the ready latch."""
