"""purax.parallel: meshes and sharding rules (see the parallel issue; empty for now)."""
