"""Example harnesses and configurations; ``DEMO_CONFIG`` is what ``grove demo`` trains."""

from pathlib import Path

__all__ = ["DEMO_CONFIG"]

DEMO_CONFIG = Path(__file__).with_name("demo.yaml")
