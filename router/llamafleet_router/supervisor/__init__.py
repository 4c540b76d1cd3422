"""`llamafleet router --workers N`: one supervisor process and N gateway worker processes per pod.

One gateway process is bound by one core (its event loop). With N > 1 the `llamafleet router` process
starts N workers (`python -m llamafleet_router.worker`), each the ordinary gateway (`cli.run`) on the
same client port (`sockets.py`), restarts one that dies (`processes.py`), forwards SIGTERM and SIGINT
to them, and alone serves `metrics_port`: `/metrics` merges what every worker serves on a private
loopback port, each sample labelled `worker="i"` (`merge.py`), and `/health` is every worker's
(`front.py`).

Each worker is a replica of its own: its slot leases are held under its own name (the replica name
carries the pid), and per-key limits, session affinity and the in-flight book are per worker. That is
why more than one worker needs the Redis index: the leases keep two workers off one slot, as they keep
two pods of the gateway off one.
"""
