"""Benchmarks behind ``saria bench``."""
