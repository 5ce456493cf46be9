"""Renderers: one module per output format, each built from Measurements."""
