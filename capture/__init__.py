"""The serving side: rendering, exact-token splice, inference engines, the HTTP gateway."""
