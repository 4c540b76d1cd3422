"""llamafleet_core: what the router, the agent and the operator share, and nothing else."""
