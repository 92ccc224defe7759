"""`draftsmith doctor`, what every engine shares: the command-line and config reading (args.py), the contract an
export carries (contract.py), the checks every reader makes (checks.py) and the run (run.py). Each engine's own
reader is that engine's doctor.py."""
