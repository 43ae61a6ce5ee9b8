"""JSON views of a plan that the worker stores and the service serves (one module per view)."""
