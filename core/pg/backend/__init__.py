"""Django's PostgreSQL backend with a fast refusal while the database is unreachable
(``ENGINE = "core.pg.backend"``; ``base.py`` says what it changes)."""
