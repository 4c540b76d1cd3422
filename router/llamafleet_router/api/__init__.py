"""HTTP routes of the gateway: parse, authenticate, schedule, proxy."""
