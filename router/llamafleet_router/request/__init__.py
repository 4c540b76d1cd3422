"""One request's life in the gateway: its prompt identity (prompts.py), the director that owns it
(director.py), the slot claim it holds (claim.py), and what runs after its response (after.py)."""
