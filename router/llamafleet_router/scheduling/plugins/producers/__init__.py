"""Producers: the only plugins that do I/O; they write what scorers read into the CycleState."""
