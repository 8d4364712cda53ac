"""Integrations: Lightning strategies that run the engine's grid inside Lightning's loops (Lightning is
imported by these modules only)."""
