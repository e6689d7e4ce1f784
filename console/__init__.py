"""The operator console: every page, partial, dialog and WebSocket consumer. An edge: it reads through
selectors and writes only by calling the contract services."""
