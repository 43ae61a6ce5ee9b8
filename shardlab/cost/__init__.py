"""What a plan costs: clusters as data, compute and communication time, memory per rank,
a timeline of every rank and stream, Chrome trace export, and plan comparison."""
