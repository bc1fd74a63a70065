"""Shared pieces for the whole suite."""
