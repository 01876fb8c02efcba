"""What a run shows: text tables, the live display, the run's history read back from its records,
plots and the HTML report."""
