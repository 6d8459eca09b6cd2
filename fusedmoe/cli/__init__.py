"""The ``fusedmoe`` command line (see main.py)."""
