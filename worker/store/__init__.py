"""The one door to the database: every SQL call of the worker, the CLI, the API and the console,
one module per aggregate (the migration runner, worker/schema.py, and the throwaway cluster,
worker/localpg.py, aside)."""
