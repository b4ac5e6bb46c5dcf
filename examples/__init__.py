"""Example harnesses (``harness.target: examples.recency_agent:play`` from a checkout); they are not
installed with Grove. The demo's own agent and configuration live in ``grove.demo``."""
