"""The demo that ``grove demo`` (``make demo``) trains: its configuration (``DEMO_CONFIG``), the
tool-using compaction agent it plays, that agent's tasks, and the warm start that teaches the
embedded model to call the agent's tool before GRPO begins (``docs/train.md``, "The demo")."""

from pathlib import Path

__all__ = ["DEMO_CONFIG"]

DEMO_CONFIG = Path(__file__).with_name("demo.yaml")
