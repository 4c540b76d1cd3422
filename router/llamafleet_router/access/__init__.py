"""Who may do what: API keys (auth.py), their tenant namespaces (tenancy.py) and their limits
(limits.py)."""
