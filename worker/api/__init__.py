"""The HTTP API process (`webhook-worker api`): /v1 over the SQL functions, tokens, roles, probes.

How the pieces fit, and how the console plugs in:

- `worker.api.app.create_app(state, console)` builds the aiohttp application; `serve(config)` runs
  it on api.host/api.port, and /metrics (`create_metrics_app`) on api.metrics_port, through
  `worker.api.serving.Listeners` (read deadlines and connection caps). `ApiState` (app[STATE],
  both in `worker.web.context`, which the console imports) holds the config, the database
  (`state.db`), the keyring (None without keys), the metrics and the failed-authentication limiter.
- Each /v1 route is one `worker.api.declare.Route` in `worker.api.routes.ROUTES`: its roles, body,
  query and path id models and its answers' models; the middleware checks the roles, the route
  reads and validates the inputs before its handler runs, and `worker.api.openapi` writes the
  OpenAPI document from the same list (`python -m worker.api.openapi > docs/openapi.json`).
- The console is a sub-application mounted at /console/. `webhook-worker api` looks for
  `worker.console.create_console_app(state: ApiState) -> web.Application` and, when that module
  exists, mounts what it returns (`app.add_subapp("/console", ...)`). Nothing else is needed.
- The API's middleware authenticates only paths under /v1/ (Bearer tokens); /console/ does its own
  login. To turn a token a person typed into a caller, await `state.verify_token(token,
  client_address(request))`: it returns a `Caller(name, role)` or raises a `Problem` (401 for an
  unknown, revoked or expired token, 429 for one from an address locked out for failing too
  often; a valid token always passes). Failures count against the address (`client_address` in
  `worker.web.context`), shared with the API;
  any other credential (a console session) goes through the same rule, `state.check_credential`.
  Re-check the token on each request (sessions should store the token's hash or the token itself
  server-side, not the role): a revoked token must stop at once.
- Database work for a caller: `async with state.db.transaction(caller) as conn:` runs one
  transaction under the caller's database role (webhooks_reader for reader, webhooks_producer for
  producer, webhooks_admin for admin). Call the SQL functions by name inside it; the helpers
  in worker.api.queries answer the same questions the /v1 routes do. `state.db.connection()` is
  the login resting as webhooks_authenticator: token and session checks only.
- Errors: raise `worker.web.problems.Problem` (or its helpers) for RFC 9457 documents.
"""
