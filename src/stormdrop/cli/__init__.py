"""The command line: argument parsing into option values and the commands."""
