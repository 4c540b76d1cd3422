"""The router's scheduling pipeline: producers -> filters -> slot candidates -> weighted scorers -> picker.

The shape follows the Gateway API inference extension (EPP): each plugin is a small class in its own module
under `plugins/`, composed by a pydantic config (`config.py`) through an explicit registry (`registry.py`).
Only producers do I/O; filters, scorers and pickers are pure and testable with hand-built endpoints.
`scheduler.Scheduler` runs the pipeline, leases the chosen slot and returns a `framework.Decision`.
"""
