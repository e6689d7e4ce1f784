"""The /api/v1/ surface (django-ninja): an edge that parses, calls one service, and answers JSON."""
