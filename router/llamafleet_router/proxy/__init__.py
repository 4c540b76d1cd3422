"""Talking to a pod: forward a request and relay its answer (forward.py, relay.py, sse.py), the
upstream client (upstream.py), and giving up when the pod leaves (gone.py)."""
