"""The application on top: command line, configuration, wiring, the demo."""
