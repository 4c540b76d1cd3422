"""One scheduled request's life in the gateway: the director that owns it (director.py, built whole by
assembly.py), the slot claim it holds and its one release (claim.py), slots lent to background builds
(lender.py), the end of its response (finish.py) and what runs after it (after.py)."""
