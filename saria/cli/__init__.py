"""The ``saria`` command line."""
