"""Custom resources of llamafleet.io/v1alpha1: the pydantic models and the CRD generator."""
