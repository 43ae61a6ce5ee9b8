"""Pydantic request and response schemas, one module per group of resources."""
