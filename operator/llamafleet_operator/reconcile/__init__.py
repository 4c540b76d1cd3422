"""Level-based reconcile: read the cluster, compute what should be, make it so, report it in status.

Nothing here imports kopf: handlers translate between kopf and these functions (`InvalidSpec` becomes a
`PermanentError`), so the reconcile logic runs the same from a create handler, a resume after an operator
restart, or a timer tick.
"""
