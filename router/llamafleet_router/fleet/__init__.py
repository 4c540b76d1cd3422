"""What the gateway knows of its pods: in-flight requests and endpoint states (state.py), slot leases
shared by replicas (leases.py), and which fleet serves a model name (ownership.py)."""
