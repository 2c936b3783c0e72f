"""Helpers every layer may use."""
