"""Pure decisions: plain functions and values without I/O, which the worker, the store and every
adapter (the CLI, the API, the console) share."""
