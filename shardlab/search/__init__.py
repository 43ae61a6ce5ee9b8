"""Automatic strategy search: the space (`space`), evaluating candidates with the planner
(`evaluate`), and the ranked results with their Pareto front (`results`); `run.search`
walks it all."""
