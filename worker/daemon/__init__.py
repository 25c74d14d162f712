"""The worker process (`webhook-worker run`): the loop that claims, hands each request to the sender
and finishes (worker.py), one attempt (attempt.py), its outcomes and their writing (outcomes.py,
finisher.py), the side tasks (maintenance.py), this process's liveness (liveness.py), the HTTP
sender (sender.py) and the database retry helpers (retrying.py)."""
