"""Pickers: rank the weighted candidates; exactly one per profile."""
