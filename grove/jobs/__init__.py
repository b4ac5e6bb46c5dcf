"""The commands that run things: the gateway (``serve``), the main job (``train``) and its parts."""
