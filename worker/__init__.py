"""webhook-worker: webhook delivery from a PostgreSQL queue."""

__version__ = "0.1.0"
