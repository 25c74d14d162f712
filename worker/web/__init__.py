"""What the HTTP API and the console share, so that neither imports the other: the process's state
(config, database, keys, metrics, limits), the caller of a request and its roles, the client's
address, problem documents, the failed-authentication limiter, and the payload checks' processes."""
