"""The record and its wire form: JSON with NaN (wire), the internal dataclasses (types),
the pydantic edge models (schemas), the budgets every string and map obeys (limits), the
format's JSON Schema, and the one helper that points at a bad line of YAML.
"""
