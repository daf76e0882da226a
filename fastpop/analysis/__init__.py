"""Reading finished runs: plots, sweep tables, aggregate statistics with intervals, lineage."""
