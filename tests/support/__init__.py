"""The tests' scaffolding, one module per concept (`memkube`: an in-memory API for fast unit tests)."""
