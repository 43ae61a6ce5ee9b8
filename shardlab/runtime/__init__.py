"""Executing graphs and programs: the one-device reference (numpy) and, later, the
simulated mesh and real ranks."""
