"""The benchmark's sections, one module each: bench/run.py lists them, bench/section.py says what one is."""
