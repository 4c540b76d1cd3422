"""Scorers: pure functions of (request, cycle state, slot candidates) -> scores in [0, 1]."""
