"""The benchmark's sections, one module each; bench/run.py lists them and bench/section.py says what one is."""
